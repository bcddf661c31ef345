//go:build !linux

package ssh

import "syscall"

// rcvLowatWakes: elsewhere SO_RCVLOWAT is not known to hold back poll
// wake-ups; the gate is off.
const rcvLowatWakes = false

func setRcvLowat(syscall.RawConn, int) error { return nil }
