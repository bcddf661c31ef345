//go:build !linux

package accept

import "net"

// QuickAck returns c unchanged: TCP_QUICKACK exists only on Linux.
func QuickAck(c net.Conn) net.Conn { return c }
