//go:build unix

// Package diskspace tells how much space a file system has left, so that
// the caches never fill the disk the repositories live on.
package diskspace

import "syscall"

// Free is the space on dir's file system that packwire may still use.
func Free(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}
