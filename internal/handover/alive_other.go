//go:build !unix

package handover

import (
	"errors"
	"syscall"
)

// UpgradeSignal: packwire does not serve on this platform (server.CheckPlatform).
const UpgradeSignal = syscall.Signal(0x1f)

// Alive is not known here: packwire does not serve on this platform.
func Alive(pid int) bool { return false }

// Signal is not supported here.
func Signal(pid int, sig syscall.Signal) error { return errors.New("not supported on this platform") }
