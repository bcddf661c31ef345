//go:build !windows

package pgtest

import (
	"os/exec"
	"syscall"
)

// credential is the user postgres runs as (root may not run it).
type credential struct{ uid, gid uint32 }

// runAs makes cmd run as cred (nil: this process's user), in a process
// group of its own when group is set.
func runAs(cmd *exec.Cmd, cred *credential, group bool) {
	attr := &syscall.SysProcAttr{Setpgid: group}
	setParentDeath(attr)
	if cred != nil {
		attr.Credential = &syscall.Credential{Uid: cred.uid, Gid: cred.gid}
	}
	cmd.SysProcAttr = attr
}

// interrupt asks postgres for a fast shutdown.
func interrupt(cmd *exec.Cmd) { cmd.Process.Signal(syscall.SIGINT) }

// killGroup kills postgres and its children.
func killGroup(cmd *exec.Cmd) { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
