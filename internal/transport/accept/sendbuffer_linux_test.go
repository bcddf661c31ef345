package accept

import (
	"context"
	"net"
	"testing"

	"golang.org/x/sys/unix"
)

// TestGrowSendBuffer: a request's connection, found through its context
// and the listener's wrapper, gets wmem_max as its send buffer when that
// beats autotuning, and is left to autotuning otherwise.
func TestGrowSendBuffer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := NewListener(l, 10, nil, nil)
	defer ln.Close()
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sndbuf := func() int {
		var v int
		rc, _ := c.(*countedConn).Conn.(*net.TCPConn).SyscallConn()
		rc.Control(func(fd uintptr) { v, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF) })
		return v
	}
	before := sndbuf()
	max, autotuned, err := sendBufferLimits()
	if err != nil {
		t.Fatal(err)
	}
	set := GrowSendBuffer(ConnContext(context.Background(), c))
	switch {
	case 2*max > autotuned && (!set || sndbuf() != 2*max):
		t.Fatalf("wmem_max %d, tcp_wmem max %d: set %v, SO_SNDBUF %d, want %d", max, autotuned, set, sndbuf(), 2*max)
	case 2*max <= autotuned && (set || sndbuf() != before):
		t.Fatalf("wmem_max %d, tcp_wmem max %d: set %v, SO_SNDBUF %d, want autotuning's %d", max, autotuned, set, sndbuf(), before)
	}
	if GrowSendBuffer(context.Background()) {
		t.Fatal("a context without a connection set a buffer")
	}
	// Debian's defaults (wmem_max 208 KiB, tcp_wmem up to 4 MiB): a fixed
	// buffer would be smaller than autotuning's, so none is set.
	if got := sendBufferFor(212992, 4<<20); got != 0 {
		t.Fatalf("wmem_max 208 KiB: asks for %d, want none", got)
	}
	if got := sendBufferFor(4<<20, 4<<20); got != 4<<20 {
		t.Fatalf("wmem_max 4 MiB: asks for %d, want 4 MiB (8 MiB once doubled)", got)
	}
}
