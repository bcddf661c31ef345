package ssh

import "net"

// smallReadBuffer is the room readBufferedConn reads into: more than an
// SSH version line (at most 255 bytes, RFC 4253 4.2) and the start of the
// client's key exchange init that usually follows it in the same segment.
const smallReadBuffer = 512

// readBufferedConn serves reads smaller than smallReadBuffer from one read
// of the socket. x/crypto/ssh reads the client's version line one byte at
// a time (v0.58: readVersion), which was ~40 read syscalls per connection,
// each followed by accept.QuickAck's setsockopt; afterwards it reads
// through its own 4 KiB bufio.Reader, which passes here unbuffered.
// Reads come from one goroutine at a time (the handshake, then the
// transport's read loop), so there is no lock.
type readBufferedConn struct {
	net.Conn
	buf  [smallReadBuffer]byte
	r, w int
	err  error // the socket's error, returned once buf is drained
}

func (c *readBufferedConn) Read(p []byte) (int, error) {
	if c.r < c.w {
		n := copy(p, c.buf[c.r:c.w])
		c.r += n
		return n, nil
	}
	if c.err != nil {
		err := c.err
		c.err = nil
		return 0, err
	}
	if len(p) >= len(c.buf) {
		return c.Conn.Read(p)
	}
	n, err := c.Conn.Read(c.buf[:])
	m := copy(p, c.buf[:n])
	c.r, c.w = m, n
	if m < n {
		c.err = err // deliver the buffered bytes first
		return m, nil
	}
	return m, err
}
