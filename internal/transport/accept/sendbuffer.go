package accept

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
)

// GrowSendBuffer gives the connection of a request with a ConnContext
// context the largest send buffer the system allows (net.core.wmem_max;
// the kernel doubles it) when that is more than TCP's autotuning reaches
// (tcp_wmem's maximum), and leaves it to autotuning otherwise: a fixed
// SO_SNDBUF turns autotuning off, so a smaller one would only hurt. For
// large bodies sent by sendfile to a client that reads more slowly than
// the kernel copies (LFS downloads): each refill of the buffer costs a
// netpoller wake-up, a park and Go scheduler work, and a larger buffer
// means fewer refills (bench/LFS.md). It reports whether it set one.
func GrowSendBuffer(ctx context.Context) bool {
	size := largeSendBuffer()
	if size <= 0 {
		return false
	}
	c, _ := ctx.Value(connKey{}).(net.Conn)
	for c != nil {
		if b, ok := c.(interface{ SetWriteBuffer(int) error }); ok {
			return b.SetWriteBuffer(size) == nil
		}
		switch u := c.(type) {
		case *tls.Conn:
			c = u.NetConn()
		case interface{ NetConn() net.Conn }:
			c = u.NetConn()
		default:
			c = nil
		}
	}
	return false
}

// largeSendBuffer is the SO_SNDBUF GrowSendBuffer sets, or 0 for none;
// read once (the sysctls are the system's, set at boot).
var largeSendBuffer = sync.OnceValue(func() int {
	max, autotuned, err := sendBufferLimits()
	if err != nil {
		return 0
	}
	return sendBufferFor(max, autotuned)
})

// sendBufferFor is the SO_SNDBUF to ask for under these limits: wmem_max
// when the buffer the kernel makes of it (twice) beats autotuning's
// maximum, else 0 (none).
func sendBufferFor(max, autotuned int) int {
	if 2*max <= autotuned {
		return 0
	}
	return max
}

var errNoLimits = errors.New("send buffer limits unknown on this system")
