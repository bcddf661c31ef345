package accept

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// QuickAck makes the kernel acknowledge what the client sends at once
// instead of after the delayed-ACK timer (40 ms on Linux). git writes a
// protocol v2 command as several small writes; with Nagle on the client's
// side, each write after the first waits for the ACK of the one before, so
// every v2 command over git:// cost about 40 ms even on loopback, and the
// client could not avoid it. Linux clears TCP_QUICKACK on its own, so it
// is set again after every read. Other connections are returned as they are.
func QuickAck(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	q := &quickAckConn{TCPConn: tc, raw: raw}
	q.set()
	return q
}

type quickAckConn struct {
	*net.TCPConn
	raw syscall.RawConn
}

func (q *quickAckConn) set() {
	q.raw.Control(func(fd uintptr) {
		unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_QUICKACK, 1)
	})
}

func (q *quickAckConn) Read(p []byte) (int, error) {
	n, err := q.TCPConn.Read(p)
	q.set()
	return n, err
}
