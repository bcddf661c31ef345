//go:build unix && !linux

package procgroup

import "syscall"

// No Pdeathsig outside Linux.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
