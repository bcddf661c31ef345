package ssh

import (
	"net"
	"testing"
	"time"
)

// gatePair is a readGate over one end of a pipe, and the other end.
func gatePair(t *testing.T) (*readGate, net.Conn) {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	return newReadGate(a), b
}

// readAsync reads one byte through g and reports when it has.
func readAsync(g *readGate) <-chan error {
	done := make(chan error, 1)
	go func() {
		var buf [1]byte
		_, err := g.Read(buf[:])
		done <- err
	}()
	return done
}

// TestReadGateHoldsUntilReleaseOrWait: a hold keeps the read back while
// data is there; a release, or a writer starting to wait for an adjust,
// lets it through; Close opens the gate for good.
func TestReadGateHoldsUntilReleaseOrWait(t *testing.T) {
	for _, open := range []struct {
		name string
		do   func(g *readGate)
	}{
		{"release", func(g *readGate) { g.release() }},
		{"waiting", func(g *readGate) { g.waiting(1) }},
		{"close", func(g *readGate) { g.Close() }},
	} {
		t.Run(open.name, func(t *testing.T) {
			g, peer := gatePair(t)
			g.hold()
			done := readAsync(g)
			go peer.Write([]byte("x"))
			// Absence over a short while (the hold's own bound is longer).
			select {
			case err := <-done:
				t.Fatalf("read went through a shut gate (err %v)", err)
			case <-time.After(maxReadHold / 5):
			}
			open.do(g)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("read still held after the gate opened")
			}
		})
	}
}

// TestReadGateHoldIsBounded: a hold nobody releases delays a read by
// maxReadHold, not for good; a hold while a writer waits is no hold.
func TestReadGateHoldIsBounded(t *testing.T) {
	g, peer := gatePair(t)
	go peer.Write([]byte("xy"))
	g.hold()
	start := time.Now()
	select {
	case <-readAsync(g):
	case <-time.After(10 * time.Second):
		t.Fatal("a hold nobody released kept the read back for good")
	}
	if d := time.Since(start); d < maxReadHold {
		t.Fatalf("read went through after %v, want the hold's %v", d, maxReadHold)
	}
	g.waiting(1)
	start = time.Now()
	<-readAsync(g)
	if d := time.Since(start); d >= maxReadHold {
		t.Fatalf("read took %v with a writer waiting: the gate should be open", d)
	}
}

// TestReadGateHoldFor: holdFor delays the next read by about the time
// given, at most maxWaitHold, and only the next one.
func TestReadGateHoldFor(t *testing.T) {
	g, peer := gatePair(t)
	go peer.Write([]byte("xyz"))
	for _, tc := range []struct{ ask, want time.Duration }{
		{5 * time.Millisecond, 5 * time.Millisecond},
		{time.Hour, maxWaitHold},
	} {
		g.holdFor(tc.ask)
		start := time.Now()
		<-readAsync(g)
		if d := time.Since(start); d < tc.want || d > tc.want+10*time.Second {
			t.Fatalf("holdFor(%v): read after %v, want %v", tc.ask, d, tc.want)
		}
	}
	if !g.until.IsZero() {
		t.Fatal("a hold outlived the read it delayed")
	}
}

// TestReadsCoalesceWindowAdjusts: while a large pack streams to a client
// that returns window as it reads (x/crypto/ssh's client: one adjust per
// ~96 KiB), the server reads its connection far less often than the
// client sends adjusts: several are read at once, not each as it comes
// (bench/SSHPERF.md: each read cost a chain of wake-ups).
func TestReadsCoalesceWindowAdjusts(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	bigRepo(t, h, "team/big")
	readsBefore := h.connReads()
	_, received, sent := slowCloneCounting(t, h, "team/big.git")
	reads := h.connReads() - readsBefore
	t.Logf("pack %d MiB: the client sent %d packets, the server read %d times", received>>20, sent, reads)
	if sent < 100 {
		t.Fatalf("the client sent only %d packets for %d MiB: the measurement cannot tell", sent, received>>20)
	}
	if reads*2 > sent {
		t.Fatalf("the server read %d times for %d packets: adjusts are not read together", reads, sent)
	}
}

// connReads sums the reads of every open connection's gate.
func (h *harness) connReads() int64 {
	h.srv.mu.Lock()
	defer h.srv.mu.Unlock()
	var n int64
	for c := range h.srv.conns {
		n += c.gate.reads.Load()
	}
	return n
}
