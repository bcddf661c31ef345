package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"packwire/internal/fetchcache"
	"packwire/internal/gitexec"
	"packwire/internal/pktline"
	"packwire/internal/protocol"
	"packwire/internal/reach"
)

// Pace is how fast a client must send its request before packwire spends
// a git process slot or a pack generation slot on it: an HTTP fetch body,
// or the pack request of a git:// or SSH session. A client that trickles
// (a byte every few seconds keeps any idle timer alive) is cut off once it
// falls behind. The zero Pace sets no bound.
type Pace struct {
	// Grace is how long a request may take whatever its size.
	Grace time.Duration
	// MinRate, in bytes per second, is what a request must average after
	// Grace (0: no rate bound).
	MinRate int64
	// Max bounds the whole request, however fast (0: no bound).
	Max time.Duration
}

// deadline is when a request that started at start and has n bytes so far
// falls behind; zero: never.
func (p Pace) deadline(start time.Time, n int64) time.Time {
	var d time.Time
	if p.MinRate > 0 {
		d = start.Add(p.Grace + time.Duration(float64(n)/float64(p.MinRate)*float64(time.Second)))
	}
	if p.Max > 0 {
		if end := start.Add(p.Max); d.IsZero() || end.Before(d) {
			d = end
		}
	}
	return d
}

// ErrTooSlow is the cause of a request cut off for falling behind its Pace.
var ErrTooSlow = errors.New("request too slow")

// slowError is the refusal of a request that fell behind.
func (p Pace) slowError(n int64, took time.Duration) *Error {
	msg := fmt.Sprintf("request too slow: %d bytes in %s", n, took.Round(time.Second))
	switch {
	case p.MinRate > 0 && p.Max > 0:
		msg += fmt.Sprintf(" (a request must average %d bytes/s after %s and end within %s)", p.MinRate, p.Grace, p.Max)
	case p.MinRate > 0:
		msg += fmt.Sprintf(" (a request must average %d bytes/s after %s)", p.MinRate, p.Grace)
	default:
		msg += fmt.Sprintf(" (a request must end within %s)", p.Max)
	}
	return &Error{Code: CodeTimeout, Message: msg, Err: ErrTooSlow}
}

// paceWatch cancels the request (cancel, with ErrTooSlow as its cause)
// once the bytes counted by n fall behind pace. Reads blocked on the
// client end with the request's context, so no transport needs read
// deadlines of its own. stop ends the watch; it returns whether the
// request was cut off, and once it has returned cancel is not called.
//
// The check runs on a timer every paceCheck, not in a goroutine of its
// own: most requests are read in well under one interval (a CI runner's
// v2 commands are a few hundred bytes), and a goroutine started and woken
// to end for each was one of the few per-request costs a herd of runners
// multiplies.
func paceWatch(pace Pace, start time.Time, n *atomic.Int64, cancel context.CancelCauseFunc) (stop func() bool) {
	if pace.MinRate <= 0 && pace.Max <= 0 {
		return func() bool { return false }
	}
	var (
		mu      sync.Mutex
		stopped bool
		fired   bool
		timer   *time.Timer
	)
	check := func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		if d := pace.deadline(start, n.Load()); !d.IsZero() && time.Now().After(d) {
			fired = true
			cancel(ErrTooSlow) // under mu: stop returns only after it
			return
		}
		timer.Reset(paceCheck)
	}
	mu.Lock()
	timer = time.AfterFunc(paceCheck, check)
	mu.Unlock()
	return func() bool {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		timer.Stop()
		return fired
	}
}

// paceCheck is how often paceWatch compares a request with its Pace.
const paceCheck = 250 * time.Millisecond

// countingReader counts what passes, for paceWatch.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// ReadDeadliner is implemented by transports whose request body reads can
// be cut short (the HTTP transport's response writer, for its request).
type ReadDeadliner interface {
	SetReadDeadline(time.Time) error
}

// requestBody is a stateless request read whole: in memory up to
// MaxCachedBody, in a temporary file beyond.
type requestBody struct {
	mem  []byte
	file *spoolFile
	size int64
}

// reader returns the body from its start.
func (b *requestBody) reader() io.Reader {
	if b.file == nil {
		return bytes.NewReader(b.mem)
	}
	return io.NewSectionReader(b.file.f, 0, b.size)
}

func (b *requestBody) close() {
	if b.file != nil {
		b.file.close()
	}
}

// readRequest reads a stateless request body to its end, under the
// pipeline's Pace and the idle timeout, before the request takes any slot
// or spawns git: a client that trickles its body costs a goroutine, not a
// git process. It returns an *Error for a client that fell behind; other
// errors are the body's (a body over the transport's bound, a client gone).
func (c *Call) readRequest(ctx context.Context, stdin io.Reader, stdout io.Writer) (*requestBody, error) {
	p := c.p
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if d, ok := stdout.(ReadDeadliner); ok {
		// Reads blocked on the client end with the request (the pace watch
		// cancels it), and in any case within the idle timeout.
		if idle := c.timeouts.Idle; idle > 0 {
			d.SetReadDeadline(time.Now().Add(idle))
		}
		defer gitexec.DeadlineOnCancel(ctx, d.SetReadDeadline)()
	}
	counted := &countingReader{r: stdin}
	start := time.Now()
	stopPace := paceWatch(c.timeouts.Pace, start, &counted.n, cancel)
	head, err := io.ReadAll(io.LimitReader(counted, MaxCachedBody+1))
	b := &requestBody{mem: head, size: int64(len(head))}
	if err == nil && len(head) > MaxCachedBody {
		// On disk, within the Spool's bounds.
		b.mem = nil
		var f *os.File
		if f, err = os.CreateTemp(p.TempDir, "request-*"); err == nil {
			b.file = &spoolFile{f: f, spool: p.Spool, addr: remoteHost(c.Request.Remote)}
			b.size, err = io.Copy(b.file, io.MultiReader(bytes.NewReader(head), counted))
		}
	}
	if err == nil && ctx.Err() != nil {
		err = context.Cause(ctx)
	}
	if stopPace() {
		b.close()
		return nil, c.timeouts.Pace.slowError(counted.n.Load(), time.Since(start))
	}
	if err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

// runStateless serves one smart HTTP upload-pack POST (a v0/v1 negotiation
// round, a v2 ls-refs or fetch): the body is read whole first, then the
// request is admitted (only if it may generate a pack) and git runs on it.
func (c *Call) runStateless(ctx context.Context, spec gitexec.Spec, stdin io.Reader, stdout, stderr io.Writer) (gitexec.Result, error) {
	p := c.p
	body, err := c.readRequest(ctx, stdin, stdout)
	if err != nil {
		return gitexec.Result{}, err
	}
	v2 := protocol.Version(c.Request.Protocol) == 2
	if v2 && isBundleURICommand(firstCommand(body)) {
		return c.runBundleURI(body, stdout)
	}
	if perr := p.refusedCommand(firstCommand(body)); v2 && perr != nil {
		body.close()
		pktline.WriteError(stdout, perr.Message)
		return gitexec.Result{BytesIn: body.size}, perr
	}
	refsOnly := v2 && isLsRefs(body.mem)
	if !refsOnly {
		if body, err = c.withoutUnreachableHaves(ctx, body); err != nil {
			return gitexec.Result{}, err
		}
	}
	defer body.close()
	if !refsOnly {
		if err := c.checkWants(ctx, pktLines(body.reader())); err != nil {
			var perr *Error
			errors.As(err, &perr)
			pktline.WriteError(stdout, perr.Message)
			return gitexec.Result{BytesIn: body.size}, err
		}
	}
	switch {
	case refsOnly:
		// Refs only: no pack, no slot; the same answer for the same refs.
		kind := protocol.Refs
		c.running.kind.Store(&kind)
		if cmd, err := fetchcache.InspectCommand(body.mem); err == nil && body.file == nil {
			return c.runLsRefs(ctx, spec, body.mem, cmd.Key, stdout, stderr)
		}
	case p.usesFetchCache(c.Request) && body.file == nil:
		return c.runFetch(ctx, spec, body.mem, stdout, stderr)
	default:
		if err := c.admitNow(ctx, p.Limiter); err != nil {
			return gitexec.Result{}, err
		}
	}
	return c.startGit(ctx, spec, body.reader(), stdout, stderr)
}

// isLsRefs tells a v2 request whose first packet is "command=ls-refs".
func isLsRefs(body []byte) bool {
	_, line, err := pktline.NewReader(bytes.NewReader(body)).Read()
	return err == nil && string(line) == "command=ls-refs\n"
}

// checkWants refuses (with git's words) a request that wants an object no
// visible ref reaches (internal/reach).
func (c *Call) checkWants(ctx context.Context, lines []string) error {
	p := c.p
	if p.Reach == nil {
		return nil
	}
	unreachable, usage, err := p.Reach.Unreachable(ctx, c.Repo.Path, reach.Wants(lines))
	c.checkUser.Add(int64(usage.User))
	c.checkSys.Add(int64(usage.Sys))
	if err != nil {
		return &Error{Code: CodeInternal, Message: "internal error checking wanted objects", Err: err}
	}
	if len(unreachable) > 0 {
		c.p.log().Info("refused", "id", c.ID, "transport", c.Request.Transport, "repo", c.Repo.Name, "user", c.Request.Principal.String(),
			"reason", "wants an object no visible ref reaches", "object", unreachable[0], "count", len(unreachable))
		// upload-pack's own words for a want it will not serve.
		return &Error{Code: CodeForbidden, Message: "upload-pack: not our ref " + unreachable[0], Err: ErrUnreachableWant}
	}
	return nil
}

// ErrUnreachableWant is the cause of a refused want.
var ErrUnreachableWant = errors.New("want of an object no visible ref reaches")

// pktLines returns the data payloads of a pkt-line stream, up to its end
// or the first malformed packet.
func pktLines(r io.Reader) []string {
	var lines []string
	pr := pktline.NewReader(r)
	for {
		kind, p, err := pr.Read()
		if err != nil {
			return lines
		}
		if kind == pktline.Data {
			lines = append(lines, string(p))
		}
	}
}
