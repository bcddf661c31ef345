package httpdrain

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// unread is the number of bytes received on c's socket and not read yet
// (SIOCINQ, FIONREAD).
func unread(c net.Conn) (int, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0, errNoSocket
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var ioErr error
	err = raw.Control(func(fd uintptr) { n, ioErr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	if err != nil {
		return 0, err
	}
	return n, ioErr
}
