package pipeline

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"packwire/internal/pktline"
)

// admissionGate holds the client's stream of a git:// or SSH upload-pack
// session at the point where git would start generating a pack, until the
// call has a limiter slot. One git serves the whole session, so admitting
// it at connect would make `git ls-remote` (an advertisement, or a v2
// ls-refs) queue behind clones, which CI pollers run every few seconds;
// over smart HTTP each request is its own call already.
//
// Where a pack starts is the protocol's: in v0/v1 at the client's "done"
// (or, for a client that asked for no-done, the flush after its haves,
// where git may answer "ready" and send the pack); in v2 at a fetch
// command, which the gate holds whole (to its flush) before admitting it,
// under the pipeline's Pace: a client that trickles its request never
// holds a slot, and one that falls behind is refused. Negotiation before
// that (haves) goes straight through: it costs git little.
//
// The wants are checked before git sees them (check, internal/reach): in
// v0/v1 the gate holds the want section to its flush, in v2 they are in
// the fetch command it holds anyway.
//
// With the fetch cache (intercept set), a whole request may be answered
// without the session's git: each v2 fetch command, and in v0/v1 the
// request from the first want to done when no answer is due before it (no
// shallow or deepen lines, whose shallow list the client waits for; no
// flush among the haves, a negotiation round). intercept gets the request
// and either answers the client itself (handled) or leaves it to git. git
// never sees an answered request: in v2 it waits for the next command, in
// v0 it gets an empty want list and ends as after `git ls-remote`.
type admissionGate struct {
	r      io.Reader
	watch  io.Writer // the classifier's tap: every byte read, as read
	v2     bool
	admit  func() error
	check  func(wantLines []string) error // nil: every want may be served
	client io.Writer                      // where a refusal goes, as an ERR pkt-line git shows as "remote error"
	pace   Pace
	cancel context.CancelCauseFunc // ends the request when it falls behind
	// intercept answers a whole fetch request from the fetch cache, or
	// reports it did not (nil: no fetch cache).
	intercept func(request []byte) (handled bool, err error)
	// refuseCommand, if set, refuses a v2 command line (Pipeline.refusedCommand).
	refuseCommand func(line string) *Error

	scan    []byte // read, not yet parsed into whole packets
	out     []byte // parsed, for git
	held    []byte // what git must not see yet: v0's wants, the pack request
	holding holdKind
	lines   []string // payloads of the held packets
	noDone  bool     // v0: the client asked for no-done
	haves   bool     // v0: haves since the last flush
	wants   bool     // v0: the want section was seen
	shallow bool     // v0: the want section has shallow or deepen lines
	wholeV0 bool     // v0: held is the whole request from its first want
	// passToFlush: v2, a command admitted before its end (too large to
	// hold); its rest goes to git as it comes, and parsing resumes after.
	passToFlush bool
	decided     bool
	rerr        error // the client stream's error, returned once out is empty

	heldBytes atomic.Int64
	holdStart time.Time
	stopPace  func() bool

	mu       sync.Mutex
	refusal  error
	refusedC chan struct{} // closed on refusal: git's stderr goes quiet
	sideErr  error         // how the last answer intercept gave failed, under mu
	closed   bool          // under mu: the request ended, intercept no more
	busy     sync.WaitGroup
}

// holdKind is what the gate is holding.
type holdKind int

const (
	holdNothing holdKind = iota
	holdWants            // v0: the want section, to be checked at its flush
	holdWhole            // v0, fetch cache: the request after its wants, to done
	holdRequest          // the pack request, to be checked (v2) and admitted
)

func newAdmissionGate(r io.Reader, watch io.Writer, v2 bool, admit func() error, check func([]string) error, client io.Writer, pace Pace, cancel context.CancelCauseFunc) *admissionGate {
	return &admissionGate{r: r, watch: watch, v2: v2, admit: admit, check: check, client: client, pace: pace, cancel: cancel, refusedC: make(chan struct{})}
}

func (g *admissionGate) Read(p []byte) (int, error) {
	for {
		if len(g.out) > 0 {
			n := copy(p, g.out)
			g.out = g.out[n:]
			return n, nil
		}
		if g.rerr != nil {
			return 0, g.rerr
		}
		if g.decided {
			n, err := g.r.Read(p)
			if n > 0 {
				g.watch.Write(p[:n])
			}
			return n, err
		}
		n, err := g.r.Read(p)
		if n > 0 {
			g.watch.Write(p[:n])
			if ferr := g.feed(p[:n]); ferr != nil {
				return 0, ferr
			}
		}
		if err != nil {
			// The client's stream ended: git gets what was held, then the error.
			g.stopHolding()
			g.out = append(append(g.out, g.held...), g.scan...)
			g.held, g.scan = nil, nil
			g.rerr = err
		}
	}
}

// feed parses what was read into packets, passing them on or holding the
// pack request, and admits the request where a pack would start.
func (g *admissionGate) feed(b []byte) error {
	g.scan = append(g.scan, b...)
	for !g.decided {
		if len(g.scan) < 4 {
			return nil
		}
		n, err := pktline.ParseLength(g.scan[:4])
		if err != nil || n == 3 || n > pktline.MaxLength {
			// Not pkt-lines: git will refuse it; admit it as work, and
			// pass everything on from here.
			err := g.decide(false)
			if err == nil {
				g.decided, g.passToFlush = true, false
				g.out = append(g.out, g.scan...)
				g.scan = nil
			}
			return err
		}
		size := max(n, 4)
		if len(g.scan) < size {
			return nil
		}
		pkt := g.scan[:size:size]
		g.scan = g.scan[size:]
		if g.passToFlush {
			g.out = append(g.out, pkt...)
			g.passToFlush = n != 0
			continue
		}
		line := strings.TrimSuffix(string(pkt[4:]), "\n")
		if g.v2 && g.holding == holdNothing && n > 4 && g.refuseCommand != nil {
			if perr := g.refuseCommand(line); perr != nil {
				g.decided = true
				g.stopHolding()
				g.refuse(perr)
				return perr
			}
		}
		if hold := g.packet(n, line); hold > g.holding {
			if g.holding == holdNothing && g.v2 {
				g.holdStart = time.Now()
				g.stopPace = paceWatch(g.pace, g.holdStart, &g.heldBytes, g.tooSlow)
			}
			g.holding = hold
		}
		if g.holding == holdNothing {
			g.out = append(g.out, pkt...)
			continue
		}
		g.held = append(g.held, pkt...)
		g.heldBytes.Add(int64(size))
		if n > 4 {
			g.lines = append(g.lines, line)
		}
		switch {
		case g.holding == holdWants && n == 0:
			// v0: the want section ends; its wants are checked, the
			// negotiation that follows needs no slot.
			if err := g.checkWants(); err != nil {
				return err
			}
			g.lines = nil
			if g.intercept != nil && !g.shallow && len(g.held) <= MaxCachedBody {
				// For the fetch cache: held on to done, unless a round comes.
				g.holding, g.wholeV0 = holdWhole, true
				continue
			}
			g.out = append(g.out, g.held...)
			g.held, g.holding = nil, holdNothing
		case g.holding == holdWhole && (n == 0 || len(g.held) > MaxCachedBody):
			// v0: a flush among the haves is a negotiation round the
			// client may wait for: git answers it, and this request is
			// not the fetch cache's.
			g.out = append(g.out, g.held...)
			g.held, g.lines, g.holding, g.wholeV0 = nil, nil, holdNothing, false
		case g.holding == holdRequest && (!g.v2 || n == 0 || len(g.held) > MaxCachedBody):
			// v0: the done (or no-done flush) is the last of it; v2: the
			// command's flush ends it (a very large one is admitted early).
			if err := g.decide(n == 0 || !g.v2); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkWants refuses the request if it wants objects it may not have.
func (g *admissionGate) checkWants() error {
	if g.check == nil || !slices.ContainsFunc(g.lines, func(l string) bool { return strings.HasPrefix(l, "want ") }) {
		return nil
	}
	if err := g.check(g.lines); err != nil {
		g.decided = true
		g.stopHolding()
		g.refuse(err)
		return err
	}
	return nil
}

// packet looks at one packet (n its length, line its payload) and tells
// what to hold from it on.
func (g *admissionGate) packet(n int, line string) holdKind {
	if g.v2 {
		if n > 4 && line == "command=fetch" {
			return holdRequest
		}
		return holdNothing
	}
	switch {
	case n == 0: // flush
		start := g.noDone && g.haves
		g.haves = false
		if start {
			return holdRequest
		}
	case strings.HasPrefix(line, "want ") && !g.wants:
		g.wants = true
		_, caps, _ := strings.Cut(line[len("want "):], " ")
		for _, c := range strings.Fields(caps) {
			g.noDone = g.noDone || c == "no-done"
		}
		return holdWants
	case strings.HasPrefix(line, "shallow ") || strings.HasPrefix(line, "deepen"):
		g.shallow = true
	case strings.HasPrefix(line, "have "):
		g.haves = true
	case line == "done":
		return holdRequest
	}
	return holdNothing
}

// decide answers a whole request (whole: held from its start to its end)
// from the fetch cache if it can; otherwise it admits the request
// (waiting in the limiter's queue) and releases what was held to git. On
// refusal the client gets an ERR line and git's stdin ends before the
// request. In v2 the gate then looks at the session's next command; in v0
// the request was the session's last.
func (g *admissionGate) decide(whole bool) error {
	g.decided = true
	if g.stopHolding() {
		return g.Refusal()
	}
	if err := g.checkWants(); err != nil {
		return err
	}
	if whole && g.intercept != nil && (g.v2 || g.wholeV0) {
		if handled, err := g.runIntercept(g.held); handled {
			g.held, g.lines = nil, nil
			if !g.v2 {
				// git, which has read nothing of the request, gets an empty
				// want list and ends quietly.
				g.out = append(g.out, "0000"...)
			}
			if err != nil {
				// This client is gone or refused: git's stdin ends here.
				g.scan, g.rerr = nil, io.EOF
				return nil
			}
			if g.v2 {
				g.nextCommand(false)
			}
			return nil
		}
	}
	if err := g.admit(); err != nil {
		g.refuse(err)
		return err
	}
	g.out = append(g.out, g.held...)
	g.held = nil
	if g.v2 {
		g.nextCommand(!whole)
		return nil
	}
	g.out = append(g.out, g.scan...)
	g.scan = nil
	return nil
}

// nextCommand makes a v2 gate look at the session's next command; cut:
// the current one was admitted before its end, and its rest goes first.
func (g *admissionGate) nextCommand(cut bool) {
	g.decided, g.holding, g.lines, g.passToFlush = false, holdNothing, nil, cut
	g.heldBytes.Store(0)
}

// runIntercept asks intercept to answer request, unless the request has
// ended (close): nothing may write to the client after that.
func (g *admissionGate) runIntercept(request []byte) (bool, error) {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return false, nil
	}
	g.busy.Add(1)
	g.mu.Unlock()
	defer g.busy.Done()
	handled, err := g.intercept(request)
	if handled && err != nil {
		var perr *Error
		if errors.As(err, &perr) {
			g.refuse(err) // refused a slot to run git: in git's words
		}
		g.mu.Lock()
		g.sideErr = err
		g.mu.Unlock()
	}
	return handled, err
}

// close ends intercepts: it waits for one under way (whose context the
// caller cancelled) and lets no other start.
func (g *admissionGate) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.busy.Wait()
}

// SideErr is how the last answer from the fetch cache failed, if it did.
func (g *admissionGate) SideErr() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.sideErr
}

// stopHolding ends the pace watch; it reports whether the request had
// already fallen behind.
func (g *admissionGate) stopHolding() bool {
	if g.stopPace == nil {
		return false
	}
	fired := g.stopPace()
	g.stopPace = nil
	return fired
}

// tooSlow refuses a request whose held pack request fell behind the pace.
func (g *admissionGate) tooSlow(cause error) {
	g.refuse(g.pace.slowError(g.heldBytes.Load(), time.Since(g.holdStart)))
	g.cancel(cause)
}

func (g *admissionGate) refuse(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.refusal != nil {
		return
	}
	msg := err.Error()
	if perr := (*Error)(nil); errors.As(err, &perr) {
		msg = perr.Message
	}
	pktline.WriteError(g.client, msg)
	g.refusal = err
	close(g.refusedC)
}

// Refusal is the admission error the gate gave the client, if any.
func (g *admissionGate) Refusal() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.refusal
}

// quietAfterRefusal drops git's stderr once the gate refused: git only
// complains that its client hung up, which the client did not.
type quietAfterRefusal struct {
	w       io.Writer
	refused <-chan struct{}
}

func (q quietAfterRefusal) Write(p []byte) (int, error) {
	select {
	case <-q.refused:
		return len(p), nil
	default:
		return q.w.Write(p)
	}
}
