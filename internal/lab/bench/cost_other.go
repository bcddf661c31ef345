//go:build !linux

package bench

// NewCgroupReader needs Linux; elsewhere server CPU is not measured this way.
func NewCgroupReader(path string) (CPUReader, error) { return nil, errNotSupported }

// NewProcessTreeReader needs Linux's /proc.
func NewProcessTreeReader(pid int) (CPUReader, error) { return nil, errNotSupported }
