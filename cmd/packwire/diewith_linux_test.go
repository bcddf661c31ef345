package main

import (
	"os/exec"
	"syscall"
)

// dieWithTest makes a server the test starts die with the test process,
// even one killed by a timeout before its cleanups run.
func dieWithTest(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
