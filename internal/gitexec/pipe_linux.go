package gitexec

import (
	"os"

	"golang.org/x/sys/unix"
)

// growPipe asks for a larger pipe so git writes ahead instead of waking the
// relay every 64 KiB; a refusal only leaves the default size.
func growPipe(f *os.File, size int) {
	unix.FcntlInt(f.Fd(), unix.F_SETPIPE_SZ, size)
}
