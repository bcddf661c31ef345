package accept

import (
	"io"
	"net"
	"testing"

	"golang.org/x/sys/unix"
)

func TestQuickAckSetAfterEveryRead(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	raw, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	conn := QuickAck(raw)
	defer conn.Close()
	quickAck := func() int {
		var v int
		rc, _ := raw.(*net.TCPConn).SyscallConn()
		rc.Control(func(fd uintptr) { v, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_QUICKACK) })
		return v
	}
	for i := 0; i < 3; i++ {
		client.Write([]byte("0014command=ls-refs\n"))
		buf := make([]byte, 20)
		if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "0014command=ls-refs\n" {
			t.Fatalf("read %q, %v", buf, err)
		}
		if v := quickAck(); v != 1 {
			t.Fatalf("TCP_QUICKACK is %d after read %d, want 1", v, i)
		}
		// A reply right after a request puts the kernel in its interactive
		// ("pingpong") mode, in which it delays ACKs: the next read must
		// turn quick ACKs back on.
		conn.Write([]byte("0000"))
		io.ReadFull(client, make([]byte, 4))
	}
	// Half-close still works through the wrapper (refusals rely on it).
	if _, ok := conn.(interface{ CloseWrite() error }); !ok {
		t.Fatal("the wrapped connection lost CloseWrite")
	}
	if _, ok := QuickAck(fakeConn{}).(fakeConn); !ok {
		t.Fatal("a non-TCP connection must come back unchanged")
	}
}

type fakeConn struct{ net.Conn }
