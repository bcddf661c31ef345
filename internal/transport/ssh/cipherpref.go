package ssh

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"slices"
	"strings"
	"time"
)

// SSH picks the first cipher of the client's list that the server also
// offers (RFC 4253 7.1), and both sides send their lists at once, so a
// server cannot state a preference, only what it allows. OpenSSH's client
// lists chacha20-poly1305, then aes128-ctr (with hmac-sha2-256-etm) before
// aes128-gcm@openssh.com; x/crypto/ssh encrypts and authenticates AES-CTR
// with HMAC-SHA2-256 at about a sixth of AES-GCM's speed, which was ~35 ms
// of server CPU in a 33 MB clone.
//
// preferCiphers applies the server's order anyway: it sends the server's
// version line itself, reads the client's version line and key exchange
// init (its first packet, sent in clear), and offers only the first of
// the server's ciphers that the client lists in both directions. The
// library is then handed a connection that replays what was read and
// drops its own version line, which was sent already: the bytes on the
// wire, and so the exchange hash, are those of an ordinary handshake with
// that one cipher offered. Every other algorithm is untouched, and the
// cipher offered is one the server allows.
//
// The cost is a round trip: the server's key exchange init waits for the
// client's, where it usually crosses it. So it is done only where a round
// trip is cheap (the kernel's round trip of the TCP handshake at most
// preferMaxRTT), and a client that waits for the server's init before
// sending its own (none known) is served with the whole list after
// preferWait.

// preferMaxRTT is the longest round trip at which the server waits for
// the client's cipher list.
const preferMaxRTT = 5 * time.Millisecond

// preferWait is how long the server waits for the client's version line
// and key exchange init before offering its whole list as usual.
var preferWait = 2 * time.Second

// maxPeek bounds what is read before the library takes over: version
// lines (RFC 4253 4.2: 255 bytes) and one packet (35000, 6.1).
const maxPeek = 64 << 10

// msgKexInit is SSH_MSG_KEXINIT.
const msgKexInit = 20

// peekedConn is a connection whose first bytes were read already (replayed
// to the library) and whose version line was written already (the
// library's own is dropped).
type peekedConn struct {
	net.Conn
	prefix  []byte // read from the client, not yet passed on
	version []byte // the server's version line as sent, to drop from the first write
}

func (c *peekedConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

var errVersionMismatch = errors.New("ssh: the library's version line differs from the one sent")

func (c *peekedConn) Write(p []byte) (int, error) {
	if c.version != nil {
		if !bytes.HasPrefix(p, c.version) {
			return 0, errVersionMismatch // a second, different version line would break the session
		}
		n := len(c.version)
		c.version = nil
		if n == len(p) {
			return n, nil
		}
		m, err := c.Conn.Write(p[n:])
		return n + m, err
	}
	return c.Conn.Write(p)
}

// preferCiphers sends the server's version line on nc, reads the client's
// cipher lists and returns the connection to give the library and the
// ciphers to offer on it: the first of ciphers that the client lists both
// ways, or all of ciphers when the client's lists could not be read (in
// time, or at all; the library then reports what is wrong). nc's read
// deadline is restored to deadline.
func preferCiphers(nc net.Conn, version string, ciphers []string, deadline time.Time) (net.Conn, []string) {
	line := []byte(version + "\r\n")
	if _, err := nc.Write(line); err != nil {
		return nc, ciphers // the library fails on the same connection
	}
	pc := &peekedConn{Conn: nc, version: line}
	wait := time.Now().Add(preferWait)
	if !deadline.IsZero() && deadline.Before(wait) {
		wait = deadline
	}
	nc.SetReadDeadline(wait)
	defer nc.SetReadDeadline(deadline)
	buf := make([]byte, 0, 4096)
	for len(buf) < maxPeek {
		if c2s, s2c, state := clientCiphers(buf); state != needMore {
			pc.prefix = buf
			if state == parsed {
				for _, c := range ciphers {
					if slices.Contains(c2s, c) && slices.Contains(s2c, c) {
						return pc, []string{c}
					}
				}
			}
			return pc, ciphers
		}
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, cap(buf))
		}
		n, err := nc.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err != nil {
			break
		}
	}
	pc.prefix = buf
	return pc, ciphers
}

type peekState int

const (
	needMore peekState = iota
	parsed
	unparsable
)

// clientCiphers finds the client's encryption algorithms (client to
// server, server to client) in what it sent first: version lines, then
// its key exchange init in a plain binary packet (RFC 4253 6, 7.1).
func clientCiphers(b []byte) (c2s, s2c []string, state peekState) {
	// Lines before the one starting "SSH-" are skipped, as the library does.
	for {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return nil, nil, needMore
		}
		isVersion := bytes.HasPrefix(b, []byte("SSH-"))
		b = b[i+1:]
		if isVersion {
			break
		}
	}
	if len(b) < 5 {
		return nil, nil, needMore
	}
	length := binary.BigEndian.Uint32(b)
	if length < 2 || length > maxPeek {
		return nil, nil, unparsable
	}
	if uint32(len(b)-4) < length {
		return nil, nil, needMore
	}
	pad := uint32(b[4])
	if pad+1 > length {
		return nil, nil, unparsable
	}
	payload := b[5 : 4+length-pad]
	if len(payload) < 17 || payload[0] != msgKexInit {
		return nil, nil, unparsable
	}
	rest := payload[17:] // type and cookie
	var lists [4][]string
	for i := range lists {
		if len(rest) < 4 {
			return nil, nil, unparsable
		}
		n := binary.BigEndian.Uint32(rest)
		if uint32(len(rest)-4) < n {
			return nil, nil, unparsable
		}
		if n > 0 {
			lists[i] = strings.Split(string(rest[4:4+n]), ",")
		}
		rest = rest[4+n:]
	}
	// kex, host key, then the two cipher lists.
	return lists[2], lists[3], parsed
}
