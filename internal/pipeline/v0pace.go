package pipeline

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"packwire/internal/gitexec"
	"packwire/internal/pktline"
	"packwire/internal/protocol"
)

// negotiationPace paces the input of a protocol v0/v1 upload-pack session
// over git:// or SSH as v2's commands are paced (readRequest, the
// admission gate): each stretch of the client's negotiation, from its
// first byte to the flush or "done" that ends it (the want section, each
// batch of haves), must keep up with the pipeline's Pace. Waiting for the
// server's answer between stretches is the idle timeout's. A client that
// falls behind gets an ERR line in git's framing and the request ends
// (cancel, ErrTooSlow): a client trickling a byte a second holds a
// connection no longer than --request-timeout, as over v2.
//
// Nothing after "done" is paced (a v0 client sends nothing more), nor
// anything after bytes that are not pkt-lines (git refuses them and ends).
type negotiationPace struct {
	r      io.Reader
	pace   Pace
	client io.Writer // where the refusal goes
	cancel context.CancelCauseFunc

	// The packet being read, parsed as bytes arrive (read's goroutine).
	head    []byte // its length prefix so far
	left    int    // bytes of its payload not read yet
	payload []byte // its payload so far, if short enough to be "done"
	over    bool   // "done" seen, or not pkt-lines: nothing more to pace

	n         atomic.Int64 // bytes of the current stretch
	mu        sync.Mutex
	start     time.Time
	stopWatch func() bool // the current stretch's paceWatch; nil between stretches
	refusal   *Error
}

func newNegotiationPace(r io.Reader, pace Pace, client io.Writer, cancel context.CancelCauseFunc) *negotiationPace {
	return &negotiationPace{r: r, pace: pace, client: client, cancel: cancel}
}

func (g *negotiationPace) Read(p []byte) (int, error) {
	n, err := g.r.Read(p)
	if n > 0 && !g.over {
		g.feed(p[:n])
	}
	return n, err
}

// feed follows the packets in b, starting a stretch's watch at its first
// byte and ending it at its last.
func (g *negotiationPace) feed(b []byte) {
	for len(b) > 0 && !g.over {
		g.mu.Lock()
		if g.stopWatch == nil {
			g.start = time.Now()
			g.n.Store(0)
			g.stopWatch = paceWatch(g.pace, g.start, &g.n, g.tooSlow)
		}
		g.mu.Unlock()
		if g.left == 0 {
			k := min(4-len(g.head), len(b))
			g.head = append(g.head, b[:k]...)
			g.n.Add(int64(k))
			b = b[k:]
			if len(g.head) < 4 {
				return
			}
			size, err := pktline.ParseLength(g.head)
			g.head = g.head[:0]
			switch {
			case err != nil || size == 3 || size > pktline.MaxLength:
				g.over = true // git refuses it
				return
			case size < 4: // flush (or a delimiter, which git refuses)
				g.endStretch()
				continue
			}
			g.left = size - 4
			g.payload = g.payload[:0]
			if g.left == 0 {
				continue
			}
		}
		k := min(g.left, len(b))
		if len(g.payload)+k <= len("done\n") {
			g.payload = append(g.payload, b[:k]...)
		} else {
			g.payload = append(g.payload[:0], "x"...) // too long to be "done"
		}
		g.left -= k
		g.n.Add(int64(k))
		b = b[k:]
		if g.left == 0 {
			if p := string(g.payload); p == "done" || p == "done\n" {
				g.endStretch()
				g.over = true
			}
		}
	}
}

// endStretch stops the current stretch's watch: the client now waits for
// the server, or is done.
func (g *negotiationPace) endStretch() {
	g.mu.Lock()
	stop := g.stopWatch
	g.stopWatch = nil
	g.mu.Unlock()
	if stop != nil {
		stop() // not under mu: the watch calls tooSlow under its own lock
	}
}

// tooSlow refuses the request whose stretch fell behind (paceWatch's
// cancel, called once).
func (g *negotiationPace) tooSlow(cause error) {
	g.mu.Lock()
	g.refusal = g.pace.slowError(g.n.Load(), time.Since(g.start))
	g.mu.Unlock()
	pktline.WriteError(g.client, g.refusal.Message)
	g.cancel(cause)
}

// stop ends the pacing (the request ended) and returns the refusal the
// client was given, if any.
func (g *negotiationPace) stop() error {
	g.endStretch()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.refusal == nil {
		return nil
	}
	return g.refusal
}

// pacesNegotiation tells whether a request's input is paced by a
// negotiationPace: a v0/v1 upload-pack session of git:// or SSH served
// here (one relayed is paced where it is served).
func (c *Call) pacesNegotiation() bool {
	req := c.Request
	return req.Service == gitexec.UploadPack && !req.StatelessRPC && protocol.Version(req.Protocol) != 2 && c.route.Relay == nil
}
