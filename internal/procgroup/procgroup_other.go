//go:build !unix

package procgroup

import (
	"os"
	"os/exec"
)

// KillsWholeTree is false: without process groups, Kill reaches the child
// only, and what it started (pack-objects under upload-pack) runs on.
const KillsWholeTree = false

// Start starts cmd as it is: this OS has no process group a kill reaches.
func Start(cmd *exec.Cmd) error {
	return cmd.Start()
}

// Kill kills the process itself; its own children are not reached.
func Kill(cmd *exec.Cmd) {
	cmd.Process.Kill()
}

// Terminate is Kill where there are no signals to ask with.
func Terminate(cmd *exec.Cmd) { Kill(cmd) }

// UsageOf gives the process's own CPU time (not its children's) and no
// peak memory: the OS has no rusage.
func UsageOf(st *os.ProcessState) Usage {
	return Usage{UserCPU: st.UserTime(), SysCPU: st.SystemTime()}
}
