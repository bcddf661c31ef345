package pgtest

import "syscall"

// setParentDeath makes postgres die with the test process, even one killed
// before its cleanup ran (a timeout, ^C): no server is left behind.
func setParentDeath(attr *syscall.SysProcAttr) { attr.Pdeathsig = syscall.SIGKILL }
