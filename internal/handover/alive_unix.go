//go:build unix

package handover

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

// UpgradeSignal asks a serving packwire to hand over to a new process
// (packwire upgrade), as nginx's USR2.
const UpgradeSignal = syscall.SIGUSR2

// Alive reports whether a process with this pid runs: exists and, where
// /proc tells, is not a zombie (an exited process its parent has not
// waited for yet).
func Alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && err != syscall.EPERM {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return !os.IsNotExist(err) || !procMounted()
	}
	// pid (comm) STATE ...: comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(stat), ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

func procMounted() bool {
	_, err := os.Stat("/proc/self/stat")
	return err == nil
}

// Signal sends sig to pid.
func Signal(pid int, sig syscall.Signal) error { return syscall.Kill(pid, sig) }
