package ssh

import (
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// gatedPair is a loopback TCP connection whose accepted end has an
// adjustGate, as the server's does, and the client's end.
func gatedPair(t *testing.T) (gate *adjustGate, client net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	nc, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); nc.Close() })
	if gate = newAdjustGate(nc, &readBufferedConn{Conn: nc}); gate == nil {
		t.Fatal("no gate for a TCP connection")
	}
	return gate, c
}

// readable polls the gated socket as the netpoller's epoll does (the
// kernel's tcp_poll applies SO_RCVLOWAT alike), waiting at most wait,
// once queued bytes are in its receive queue.
func readable(t *testing.T, g *adjustGate, queued int, wait time.Duration) bool {
	t.Helper()
	var ready bool
	g.raw.Control(func(fd uintptr) {
		for deadline := time.Now().Add(30 * time.Second); ; {
			n, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ)
			if err != nil {
				t.Fatal(err)
			}
			if n >= queued {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d bytes arrived of %d", n, queued)
			}
			time.Sleep(time.Millisecond)
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(wait/time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		ready = n == 1
	})
	return ready
}

func send(t *testing.T, c net.Conn, n int) {
	t.Helper()
	if _, err := c.Write(make([]byte, n)); err != nil {
		t.Fatal(err)
	}
}

// noFallback keeps the gate's fallback from lowering the mark during a
// test: only the kernel's low mark decides.
func noFallback(g *adjustGate) {
	g.mu.Lock()
	g.timer.Reset(time.Hour)
	g.mu.Unlock()
}

// TestAdjustGateWakesOnceForAll: while the mark is raised, the socket is
// not readable (nobody is woken) until all the marked bytes are there,
// however many small writes bring them (the client's window adjusts, 36
// bytes each with AES-GCM).
func TestAdjustGateWakesOnceForAll(t *testing.T) {
	gate, client := gatedPair(t)
	const adjust, adjusts = 36, 8
	gate.hold(adjust * adjusts)
	defer gate.release()
	noFallback(gate)
	for i := 1; i < adjusts; i++ {
		send(t, client, adjust)
		if readable(t, gate, i*adjust, 0) {
			t.Fatalf("readable after %d of %d adjusts", i, adjusts)
		}
	}
	send(t, client, adjust)
	if !readable(t, gate, adjusts*adjust, 0) {
		t.Fatal("not readable with all the marked bytes there")
	}
}

// TestAdjustGateNeverHoldsInputForGood: bytes short of the mark are
// readable as soon as the writer runs again (release), or gateFallback
// later if it does not: a client that stops returning window before the
// estimate is reached, or that says something else (a keepalive answer),
// is not held back for good.
func TestAdjustGateNeverHoldsInputForGood(t *testing.T) {
	t.Run("release", func(t *testing.T) {
		gate, client := gatedPair(t)
		gate.hold(1000)
		noFallback(gate)
		send(t, client, 36)
		if readable(t, gate, 36, 0) {
			t.Fatal("readable below the mark")
		}
		gate.release()
		if !readable(t, gate, 36, 0) {
			t.Fatal("not readable once the writer ran again")
		}
	})
	t.Run("fallback", func(t *testing.T) {
		gate, client := gatedPair(t)
		gate.hold(1000)
		send(t, client, 36)
		if !readable(t, gate, 36, 30*time.Second) {
			t.Fatal("bytes below the mark were held back for good")
		}
		if holds, expired, _ := gate.stats(); holds != 1 || expired != 1 {
			t.Fatalf("holds %d, expired %d: want the one hold ended by the fallback", holds, expired)
		}
		gate.release()
	})
}

// TestAdjustGateOneWriterAtATime: with two writers of the connection
// waiting, the mark stays at 1 byte (one's estimate would hold back the
// other's adjusts).
func TestAdjustGateOneWriterAtATime(t *testing.T) {
	gate, client := gatedPair(t)
	gate.hold(1000)
	gate.hold(1000)
	defer gate.release()
	defer gate.release()
	send(t, client, 36)
	if !readable(t, gate, 36, 0) {
		t.Fatal("a second waiting writer left the mark raised")
	}
}
