//go:build unix

package bench

import (
	"os/exec"
	"syscall"
)

// setProcessGroup starts git in its own process group so that a cancelled
// operation takes its children (index-pack, remote helpers) along.
func setProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		if cmd.Process == nil {
			return nil
		}
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}
