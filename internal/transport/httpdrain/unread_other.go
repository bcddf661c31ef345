//go:build !linux

package httpdrain

import "net"

// unread is not known here: Drain closes an idle connection without
// looking at its socket.
func unread(c net.Conn) (int, error) { return 0, errNoSocket }
