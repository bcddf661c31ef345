package ssh

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// maxReadHold bounds how long readGate keeps the connection's reads back:
// a client's other traffic (a keepalive's answer, another channel's data,
// a disconnect) waits at most this long.
const maxReadHold = 50 * time.Millisecond

// maxWaitHold bounds holdFor: while a writer waits, the client holds at
// least half its allowance of unread data, which lasts longer than this
// at any rate pacing slows (the allowance grows with the rate).
const maxWaitHold = 20 * time.Millisecond

// minWaitHold is the shortest holdFor worth a timer.
const minWaitHold = 200 * time.Microsecond

// readGate holds back x/crypto/ssh's reads of the connection while a paced
// writer sends with room to spare, so that the window adjusts the client
// sends meanwhile pile up in the kernel's socket buffer and are read at
// once, when the writer runs short of room.
//
// Why: OpenSSH's client returns window about every 33 KB git reads (~1000
// adjusts for a 33 MB clone). Each adjust read as it arrives woke the read
// loop, x/crypto/ssh's mux goroutine and the writer, and the runtime's
// monitor with them: ~18,000 context switches for a repeated clone, most
// of its server CPU (bench/SSHPERF.md). Held back, they cost one wake-up
// per pacing piece instead.
//
// The gate is shut only while no writer may wait for a window adjust: a
// paced write holds it, but opens it while it waits for room
// (channelWindow.waitRoom) and while it writes a piece the channel's
// window is short of, so no writer waits for an adjust the gate keeps
// back. While a writer waits, holdFor delays each read by about the time
// the returns it needs take to come. A hold lasts at most maxReadHold. Nothing is
// buffered here: the bytes stay in the kernel, whose receive buffer (and
// so the client's sending) is bounded as before.
type readGate struct {
	net.Conn

	mu      sync.Mutex
	holders int           // writers that want reads held
	waiters int           // writers waiting for a window adjust: open whatever holders say
	closed  bool          // Close was called: never hold again
	until   time.Time     // the next read waits until then (holdFor)
	opened  chan struct{} // closed when the gate opens; nil while open
	timer   *time.Timer   // Read's bound on one hold (reads come from one goroutine)
	reads   atomic.Int64  // reads of the connection (x/crypto/ssh's read loop woken)
}

func newReadGate(c net.Conn) *readGate { return &readGate{Conn: c} }

// Read waits while the gate is shut (at most maxReadHold) and until the
// time holdFor set, then reads.
func (g *readGate) Read(p []byte) (int, error) {
	g.mu.Lock()
	opened := g.opened
	g.mu.Unlock()
	if opened != nil {
		g.startTimer(maxReadHold)
		select {
		case <-opened:
			g.timer.Stop()
		case <-g.timer.C:
		}
	}
	g.mu.Lock()
	d := time.Until(g.until)
	g.until = time.Time{}
	g.mu.Unlock()
	if d > 0 {
		g.startTimer(min(d, maxWaitHold))
		<-g.timer.C
	}
	g.reads.Add(1)
	return g.Conn.Read(p)
}

func (g *readGate) startTimer(d time.Duration) {
	if g.timer == nil {
		g.timer = time.NewTimer(d)
	} else {
		g.timer.Reset(d)
	}
}

// holdFor asks for the next read to wait until d from now (at most
// maxWaitHold): a writer waiting for window adjusts expects the ones it
// needs to take that long to come, and reads them at once then.
func (g *readGate) holdFor(d time.Duration) {
	if g == nil || d < minWaitHold {
		return
	}
	g.mu.Lock()
	if !g.closed {
		g.until = time.Now().Add(min(d, maxWaitHold))
	}
	g.mu.Unlock()
}

// Close opens the gate for good, then closes the connection.
func (g *readGate) Close() error {
	g.mu.Lock()
	g.closed = true
	g.update()
	g.mu.Unlock()
	return g.Conn.Close()
}

// hold asks for reads to be held back until release.
func (g *readGate) hold() {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.holders++
	g.update()
	g.mu.Unlock()
}

// release ends a hold.
func (g *readGate) release() {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.holders--
	g.update()
	g.mu.Unlock()
}

// waiting notes that a writer waits (+1) or stopped waiting (-1) for a
// window adjust: the gate is open while any does.
func (g *readGate) waiting(d int) {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.waiters += d
	g.update()
	g.mu.Unlock()
}

// update shuts or opens the gate as its counts say. Call with g.mu held.
func (g *readGate) update() {
	shut := g.holders > 0 && g.waiters == 0 && !g.closed
	switch {
	case shut && g.opened == nil:
		g.opened = make(chan struct{})
	case !shut && g.opened != nil:
		close(g.opened)
		g.opened = nil
	}
}
