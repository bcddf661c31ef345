//go:build !linux

package gitexec

import "os"

// growPipe does nothing: only Linux lets a pipe's capacity be set.
func growPipe(f *os.File, size int) {}
