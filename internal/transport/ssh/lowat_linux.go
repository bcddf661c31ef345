package ssh

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// rcvLowatWakes: Linux wakes a TCP socket's readers (epoll included) only
// once SO_RCVLOWAT bytes are queued (since 4.19; lowering the mark wakes
// them if enough are).
const rcvLowatWakes = true

func setRcvLowat(raw syscall.RawConn, n int) error {
	var err error
	if cerr := raw.Control(func(fd uintptr) {
		err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVLOWAT, n)
	}); cerr != nil {
		return cerr
	}
	return err
}
