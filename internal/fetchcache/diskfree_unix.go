//go:build linux || darwin

package fetchcache

import "syscall"

// freeBytes is the disk space available to unprivileged users under dir.
func freeBytes(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}
