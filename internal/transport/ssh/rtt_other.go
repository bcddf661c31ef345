//go:build !linux

package ssh

import (
	"net"
	"time"
)

// handshakeRTT is not known outside Linux: the server's cipher order is
// not applied there (see preferCiphers).
func handshakeRTT(net.Conn) (time.Duration, bool) { return 0, false }
