//go:build !linux

package bench

// fillMachine adds nothing beyond what the Go runtime knows off Linux.
func fillMachine(m *Machine) {}
