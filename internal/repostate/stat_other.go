//go:build !linux && !darwin

package repostate

import (
	"io/fs"
	"time"
)

// Without an inode number, a stamp rests on names, sizes and times.
func inode(fs.FileInfo) uint64 { return 0 }

func changeTime(fi fs.FileInfo) time.Time { return fi.ModTime() }
