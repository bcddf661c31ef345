package ssh

import (
	"net"
	"sync"
	"syscall"
	"time"
)

// adjustGate lets a paced writer that waits for window adjusts be woken
// once about as many have arrived as it needs, instead of once per adjust.
//
// Why: OpenSSH's client returns window each time it hands git data (~1000
// adjusts of ~32 KiB for a 33 MB clone), and each adjust that finds the
// server idle wakes a thread from epoll, x/crypto/ssh's read loop, its
// mux goroutine, the waiting writer and the runtime's monitor: most of a
// repeated clone's server CPU (bench/SSHPERF.md). While the writer waits,
// the gate raises the socket's SO_RCVLOWAT to the bytes that the adjusts
// it needs take on the wire, so the kernel wakes nobody before they are
// all there; the adjusts wait in the kernel's receive buffer, nothing is
// buffered here. A read that is already under way returns what is there
// (only wake-ups are held back).
//
// What it must not do is hold back input for good: the low mark is an
// estimate (see channelWindow.lowat), and the client may stop returning
// window before reaching it, or have other things to say (a keepalive
// answer, another session's data). So the mark is raised only while one
// writer of the connection waits, for at most gateFallback, and is back at
// 1 byte as soon as the writer runs again.
type adjustGate struct {
	raw    syscall.RawConn
	socket *readBufferedConn // what x/crypto/ssh reads: counts the bytes read

	mu      sync.Mutex
	holders int  // writers of this connection now waiting
	raised  bool // the low mark is above 1 byte
	timer   *time.Timer
	holds   int // waits the mark was raised for
	expired int // of them, those that gateFallback ended
}

// gateFallback bounds how long a raised low mark holds back what the
// client sent: about five adjusts' time at index-pack's pace.
const gateFallback = 10 * time.Millisecond

// maxLowat caps the low mark: far below any receive buffer, so that the
// kernel never grows the buffer for it, and a few hundred adjusts.
const maxLowat = 16 << 10

// newAdjustGate returns the gate of nc (a *net.TCPConn before any
// wrapping), read through socket; nil where SO_RCVLOWAT does not hold
// back wake-ups (not TCP, not Linux).
func newAdjustGate(nc net.Conn, socket *readBufferedConn) *adjustGate {
	tc, ok := nc.(*net.TCPConn)
	if !ok || !rcvLowatWakes {
		return nil
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	return &adjustGate{raw: raw, socket: socket}
}

// hold raises the low mark to bytes for the wait of one writer, which
// calls release when it runs again. With another writer of the
// connection waiting too, the mark stays at 1: one writer's estimate
// would hold back the other's adjusts.
func (g *adjustGate) hold(bytes int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.holders++
	if g.holders > 1 || bytes <= 1 {
		g.lower()
		return
	}
	if setRcvLowat(g.raw, min(bytes, maxLowat)) != nil {
		return
	}
	g.raised = true
	g.holds++
	if g.timer == nil {
		g.timer = time.AfterFunc(gateFallback, g.expire)
	} else {
		g.timer.Reset(gateFallback)
	}
}

// release ends a wait that hold began.
func (g *adjustGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.holders--
	g.lower()
}

// expire lowers a mark that was not reached within gateFallback.
func (g *adjustGate) expire() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.raised {
		g.expired++
	}
	g.lower()
}

// stats reports the waits the mark was raised for and how many of them
// gateFallback ended, and the reads of the socket so far.
func (g *adjustGate) stats() (holds, expired int, reads int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.holds, g.expired, g.socket.reads.Load()
}

// lower puts the low mark back at 1 byte; the kernel wakes the reader at
// once if anything is waiting. Call with mu held.
func (g *adjustGate) lower() {
	if !g.raised {
		return
	}
	g.raised = false
	if g.timer != nil {
		g.timer.Stop()
	}
	setRcvLowat(g.raw, 1)
}
