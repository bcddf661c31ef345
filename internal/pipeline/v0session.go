package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"packwire/internal/fetchcache"
	"packwire/internal/gitexec"
	"packwire/internal/pktline"
	"packwire/internal/protocol"
	"packwire/internal/repostate"
)

// recordsV0Session tells whether a git:// or SSH upload-pack session of
// protocol v0/v1 is recorded and replayed (runV0Session): with the fetch
// cache on, on this node.
func (c *Call) recordsV0Session() bool {
	req := c.Request
	return c.gated && c.p.FetchCache != nil && req.Service == gitexec.UploadPack && !req.StatelessRPC &&
		protocol.Version(req.Protocol) != 2 && c.route.Relay == nil
}

// runV0Session serves a stateful v0/v1 upload-pack session so that
// identical sessions share one git. A CI runner with history negotiates
// in rounds (16 haves, a flush, more haves, then it waits for git's ACKs),
// so its request is never whole before git answers, and the fetch cache's
// whole requests never see it. Instead the session is recorded: git's
// output after a packet depends only on the packets before it, so a
// session whose client sends the same bytes gets the same answers.
//
// The session is keyed like the answer cache's advertisements (git's
// command line, protocol, user, the repository's stamp before anything
// ran; never a racy stamp), then by its opening: what the client sends
// before it needs any answer but the advertisement (its wants, and its
// first batch of haves to the second flush, or done). Runners at the same
// commit send the same opening; one at another commit does not, so it
// neither disturbs nor is disturbed by the herd's recording.
//
//   - The first session of a key runs its git as always, recording it,
//     and publishes the advertisement and its recording once its opening
//     is known; sessions that arrive meanwhile wait for that.
//   - A later session gets the advertisement from the answer cache, reads
//     its client's opening and joins the recording of key+opening: it
//     replays it (following it as it grows) while its client's input
//     matches; or leads it, with a git of its own that is fed the opening.
//   - A follower whose input departs from the recording (or whose
//     recording failed) gets a git fed all its input so far, whose output
//     is checked byte for byte against what the follower was sent before
//     it is relayed (sessionGit).
func (c *Call) runV0Session(ctx context.Context, cancel context.CancelCauseFunc, spec gitexec.Spec, clientIn io.Reader, watch io.Writer, stdout, stderr io.Writer) (gitexec.Result, *admissionGate, error) {
	p := c.p
	in := newClientBuffer(clientIn, watch)
	go in.run()
	defer in.close()
	stamp, err := repostate.Refs(c.Repo.Path, time.Now())
	if err != nil || stamp.Racy {
		// A ref changed a moment ago: a change now could keep this stamp.
		return c.sessionGit(ctx, cancel, spec, in, repostate.Stamp{}, nil, nil, nil, stdout, stderr)
	}
	key := p.FetchCache.Key([]byte("v0 session"), []byte(strings.Join(p.Runner.Args(spec), "\x00")),
		[]byte(spec.Protocol), []byte(c.Request.Principal.User), []byte(stamp.Digest))
	adv, wait := p.answers.lookup(key)
	if wait != nil {
		select {
		case <-wait.done:
			adv = wait.body
		case <-ctx.Done():
			return gitexec.Result{}, nil, context.Cause(ctx)
		}
		if adv == nil {
			return c.sessionGit(ctx, cancel, spec, in, stamp, nil, nil, nil, stdout, stderr)
		}
	}
	if adv == nil {
		return c.leadV0Session(ctx, cancel, spec, key, stamp, in, stdout, stderr)
	}

	res, err := writeAnswer(ctx, adv, stdout, spec.Progress, 0, c.timeouts.Idle)
	if err != nil {
		return res, nil, err
	}
	opening, status := in.waitOpening(ctx, c.timeouts.Idle)
	in.release() // a git that takes over is fed the buffer, which holds the opening
	sent := &sentOutput{adv: adv, n: int64(len(adv))}
	switch status {
	case openingGone:
		// The client left after the advertisement, as a session git's
		// client may: nothing to answer.
		if ctx.Err() != nil {
			return res, nil, context.Cause(ctx)
		}
		return res, nil, nil
	case openingIdle:
		return res, nil, gitexec.ErrIdle
	case openingUncacheable:
		return c.sessionGit(ctx, cancel, spec, in, stamp, sent, nil, nil, stdout, stderr)
	}
	replay, rec, err := p.FetchCache.JoinSession(fetchcache.Key([]byte(key), opening))
	switch {
	case err != nil:
		return c.sessionGit(ctx, cancel, spec, in, stamp, sent, nil, nil, stdout, stderr)
	case rec != nil:
		return c.sessionGit(ctx, cancel, spec, in, stamp, sent, rec, nil, stdout, stderr)
	}
	defer replay.Close()
	return c.followV0Session(ctx, cancel, spec, in, stamp, replay, adv, stdout, stderr)
}

// advertisementHold bounds how long the first session of a key keeps the
// others waiting for its advertisement while its client's opening comes:
// a client that connects and sends nothing must not stall the rest.
const advertisementHold = time.Second

// leadV0Session runs the first session of key: its git's advertisement
// and then its recording are published once the client's opening is
// known (the recording first: those waiting for the advertisement then
// find it).
func (c *Call) leadV0Session(ctx context.Context, cancel context.CancelCauseFunc, spec gitexec.Spec, key string, stamp repostate.Stamp, in *clientBuffer, stdout, stderr io.Writer) (gitexec.Result, *admissionGate, error) {
	p := c.p
	rec, err := p.FetchCache.NewSessionRecording()
	if err != nil {
		p.answers.finish(key, nil)
		return c.sessionGit(ctx, cancel, spec, in, stamp, nil, nil, nil, stdout, stderr)
	}
	var adv advertisementTap
	published := make(chan struct{})
	publish := func(opening []byte, status openingStatus) {
		if status != openingComplete || !rec.Publish(fetchcache.Key([]byte(key), opening)) {
			// Nobody can follow it (no whole opening, or an identical
			// session records already): record no further, or a clone's
			// whole pack would be written to disk for nothing.
			rec.Break()
		}
	}
	go func() {
		defer close(published)
		opening, status := in.waitOpening(ctx, advertisementHold)
		if status == openingIdle {
			// A client that takes its time (or never sends) must not hold
			// up the sessions waiting for the advertisement.
			p.answers.finish(key, adv.answer())
			publish(in.waitOpening(ctx, 0))
			in.release()
			return
		}
		publish(opening, status)
		in.release()
		p.answers.finish(key, adv.answer())
	}()
	res, gate, err := c.sessionGit(ctx, cancel, spec, in, stamp, nil, rec, &adv, stdout, stderr)
	in.close() // the publisher's wait ends with the session
	<-published
	return res, gate, err
}

// followV0Session replays a recording to a session that was sent the
// advertisement adv: each piece of output goes out once
// the client's input matches the recording's up to where git wrote it.
// When the input departs, git takes over (sessionGit).
func (c *Call) followV0Session(ctx context.Context, cancel context.CancelCauseFunc, spec gitexec.Spec, in *clientBuffer, stamp repostate.Stamp, replay *fetchcache.SessionReplay, adv []byte, stdout, stderr io.Writer) (gitexec.Result, *admissionGate, error) {
	sent := int64(len(adv))
	out := newProgressWriter(stdout, spec.Progress)
	idle := c.timeouts.Idle
	var timeout <-chan time.Time
	var timer *time.Timer
	if idle > 0 {
		timer = time.NewTimer(idle)
		defer timer.Stop()
		timeout = timer.C
	}
	seen := -1
	result := func(input []byte) gitexec.Result {
		if spec.Progress != nil {
			spec.Progress.BytesIn.Add(int64(len(input)))
		}
		return gitexec.Result{BytesIn: int64(len(input)), BytesOut: sent}
	}
	for {
		input, rerr, changed := in.snapshot()
		st := replay.Step(input, sent)
		if st.Diverged || len(input) > fetchcache.MaxSessionInput {
			return c.sessionGit(ctx, cancel, spec, in, stamp, &sentOutput{adv: adv, r: replay, n: sent}, nil, nil, stdout, stderr)
		}
		if st.SendTo > sent {
			n, err := replay.Send(ctx, out, sent, st.SendTo, idle)
			sent += n
			if err != nil {
				c.setOutcome(fetchcache.Replayed)
				return result(input), nil, err
			}
			if timer != nil {
				timer.Reset(idle)
			}
			continue
		}
		if st.Done {
			c.setOutcome(fetchcache.Replayed)
			return result(input), nil, nil
		}
		if rerr != nil && st.NeedInput {
			// The client hung up where git would still be waiting for it.
			c.setOutcome(fetchcache.Replayed)
			return result(input), nil, fmt.Errorf("%w: %v", gitexec.ErrClientGone, rerr)
		}
		if len(input) != seen && timer != nil {
			timer.Reset(idle)
		}
		seen = len(input)
		select {
		case <-st.Changed:
		case <-changed:
		case <-ctx.Done():
			c.setOutcome(fetchcache.Replayed)
			return result(input), nil, context.Cause(ctx)
		case <-timeout:
			c.setOutcome(fetchcache.Replayed)
			return result(input), nil, gitexec.ErrIdle
		}
	}
}

// errReplayDiffers is a session git's output differing from what its
// client was already sent from a recording.
var errReplayDiffers = errors.New("git's answer differs from the recorded session already sent")

// sessionGit runs the session's git on all the client's input (in, from
// its first byte), behind the admission gate as every session is. sent,
// if set, is output the client already has (an advertisement, a replay):
// git's output is checked against it byte for byte and only what follows
// goes to the client; if it differs, the session ends with an error
// rather than an inconsistent answer. rec, if set, records the session:
// its git then runs detached from the client, on while followers read.
func (c *Call) sessionGit(ctx context.Context, cancel context.CancelCauseFunc, spec gitexec.Spec, in *clientBuffer, stamp repostate.Stamp, sent *sentOutput, rec *fetchcache.SessionRecorder, adv *advertisementTap, stdout, stderr io.Writer) (gitexec.Result, *admissionGate, error) {
	p := c.p
	verify := &verifyWriter{w: stdout, verified: make(chan struct{})}
	if sent != nil && sent.n > 0 {
		verify.sent = *sent
		verify.moved = func() bool {
			now, err := repostate.Refs(c.Repo.Path, time.Now())
			return err == nil && now.Digest != stamp.Digest
		}
	} else {
		close(verify.verified)
	}
	var out io.Writer = verify
	runCtx := ctx
	var recording *recordingWriter
	if rec != nil {
		// git answers the followers too: it goes on when this client
		// leaves, until the last follower does (or the server stops).
		var runCancel context.CancelCauseFunc
		runCtx, runCancel = context.WithCancelCause(context.Background())
		defer runCancel(nil)
		stopKill := context.AfterFunc(p.killCtx, func() { runCancel(context.Cause(p.killCtx)) })
		defer stopKill()
		rec.OnAbandon(func() { runCancel(gitexec.ErrClientGone) })
		stopLeave := context.AfterFunc(ctx, rec.LeaderLeft)
		defer stopLeave()
		in.attach(rec.Input)
		recording = &recordingWriter{verify: verify, rec: rec, in: in, adv: adv}
		out = recording
	}
	gate := newAdmissionGate(c.haveFiltered(ctx, in.reader()), io.Discard, false, func() error { return c.admitNow(ctx, p.Limiter) },
		func(lines []string) error { return c.checkWants(ctx, lines) }, stdout, c.timeouts.Pace, cancel)
	if stamp.Digest != "" && !stamp.Racy {
		gate.intercept = func(request []byte) (bool, error) {
			// The answer follows git's advertisement, which git may still
			// be writing when the client's request was in hand already.
			select {
			case <-verify.verified:
			case <-runCtx.Done():
				return false, nil
			}
			return c.sessionFetch(runCtx, spec, false, stamp, request, out)
		}
	}
	if stderr != nil {
		stderr = quietAfterRefusal{w: stderr, refused: gate.refusedC}
	}
	res, err := c.startGit(runCtx, spec, gate, out, stderr)
	if verify.differs.Load() {
		p.log().Error("v0 session: git's answer differs from the replay already sent; session ended", "repo", c.Repo.Name)
		pktline.WriteError(stdout, "packwire: this fetch's shared answer could not be continued, fetch again")
		err = fmt.Errorf("%w: %w", fetchcache.ErrGenerationFailed, errReplayDiffers)
	}
	if rec != nil {
		ok := err == nil && res.ExitCode == 0 && gate.Refusal() == nil && gate.SideErr() == nil && !recording.broken
		rec.Finish(ok)
		if err == nil && recording.gone {
			err = gitexec.ErrClientGone
		}
		if err != nil && ctx.Err() != nil && !errors.Is(err, fetchcache.ErrGenerationFailed) {
			err = context.Cause(ctx)
		}
	}
	return res, gate, err
}

// sentOutput is output a session's client already has: the
// advertisement adv, then r's bytes from len(adv) to n (a replay).
type sentOutput struct {
	adv []byte
	r   io.ReaderAt
	n   int64
}

// verifyWriter checks git's output against what the client was already
// sent and passes on only what follows. One difference is allowed: a
// push that landed since the session's stamp changes git's advertisement
// (and nothing the client was sent after it: git serves any wanted object
// it has, packwire's reach check decides). So git's advertisement (its
// output to the first flush) is compared with the one sent, and where it
// differs, accepted only if the repository moved (moved); the rest is
// compared byte for byte.
type verifyWriter struct {
	w        io.Writer
	sent     sentOutput
	moved    func() bool
	head     []byte // git's advertisement so far (until advDone)
	advDone  bool
	advMoved bool          // git's advertisement differs from the one sent: a push landed
	pos      int64         // of the sent output, compared so far
	verified chan struct{} // closed once all of the sent output was matched
	differs  atomic.Bool
}

func (v *verifyWriter) Write(p []byte) (int, error) {
	total := len(p)
	if v.sent.n > 0 && !v.advDone {
		end := advertisementEnd(v.head, p)
		if end < 0 {
			v.head = append(v.head, p...)
			return total, nil
		}
		v.head = append(v.head, p[:end]...)
		p = p[end:]
		v.advDone = true
		if !bytes.Equal(v.sent.adv, v.head) {
			if !v.moved() {
				v.differs.Store(true)
				return 0, errReplayDiffers
			}
			v.advMoved = true
		}
		v.pos = int64(len(v.sent.adv))
		if v.pos == v.sent.n {
			close(v.verified)
		}
	}
	if v.pos < v.sent.n && len(p) > 0 {
		k := min(int64(len(p)), v.sent.n-v.pos)
		old := make([]byte, k)
		if _, err := v.sent.r.ReadAt(old, v.pos); err != nil || !bytes.Equal(old, p[:k]) {
			v.differs.Store(true)
			return 0, errReplayDiffers
		}
		v.pos += k
		p = p[k:]
		if v.pos == v.sent.n {
			close(v.verified)
		}
	}
	if len(p) == 0 {
		return total, nil
	}
	n, err := v.w.Write(p)
	return total - len(p) + n, err
}

// checking tells whether git's advertisement is still being compared.
func (v *verifyWriter) checking() bool { return v.sent.n > 0 && !v.advDone }

// advertisementEnd finds where a v0/v1 advertisement (pkt-lines to the
// first flush) ends in head+p, as an offset into p; -1: not yet.
func advertisementEnd(head, p []byte) int {
	all := append(head[:len(head):len(head)], p...)
	for pos := 0; pos+4 <= len(all); {
		n, err := pktline.ParseLength(all[pos : pos+4])
		if err != nil {
			return len(p) // not pkt-lines: git's whole output so far is "its advertisement"
		}
		if n == 0 {
			return pos + 4 - len(head)
		}
		pos += max(n, 4)
	}
	return -1
}

func (v *verifyWriter) SetWriteDeadline(t time.Time) error {
	if d, ok := v.w.(gitexec.WriteDeadliner); ok {
		return d.SetWriteDeadline(t)
	}
	return nil
}

// recordingWriter records git's output (and the session's fetch cache
// answers) before it goes to the leader's client; once that client is
// gone, git's output goes on into the recording only.
type recordingWriter struct {
	verify *verifyWriter
	held   []heldOutput
	rec    *fetchcache.SessionRecorder
	in     *clientBuffer
	adv    *advertisementTap
	mu     sync.Mutex
	gone   bool // the leader's client hung up
	broken bool // the recording could not be written
}

func (r *recordingWriter) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.adv != nil && r.in.total.Load() == 0 {
		r.adv.add(p)
	}
	if r.verify.checking() {
		// The client has an advertisement already: git's is checked
		// against it before any of its output is recorded, so that a
		// follower never gets bytes of an advertisement a push changed.
		r.held = append(r.held, heldOutput{bytes.Clone(p), r.rec.InputLen()})
		if err := r.toClient(p); err != nil {
			return 0, err
		}
		if !r.verify.checking() {
			if r.verify.advMoved {
				r.broken = true
				r.rec.Break()
			}
			for _, h := range r.held {
				if err := r.rec.OutputAt(h.p, h.in); err != nil {
					r.broken = true
				}
			}
			r.held = nil
		}
		return len(p), nil
	}
	if err := r.rec.Output(p); err != nil {
		r.broken = true
	}
	if err := r.toClient(p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// toClient writes p on through the verifier; a client that hung up leaves
// git running for the followers.
func (r *recordingWriter) toClient(p []byte) error {
	if r.gone {
		return nil
	}
	if _, err := r.verify.Write(p); err != nil {
		if errors.Is(err, errReplayDiffers) {
			return err
		}
		r.gone = true
		r.rec.LeaderLeft()
	}
	return nil
}

// heldOutput is output held until the advertisement is checked, with the
// input the client had sent before it.
type heldOutput struct {
	p  []byte
	in int64
}

func (r *recordingWriter) SetWriteDeadline(t time.Time) error {
	return r.verify.SetWriteDeadline(t)
}

// advertisementTap collects git's output before the client sent anything:
// the advertisement, for the answer cache.
type advertisementTap struct {
	mu   sync.Mutex
	buf  []byte
	over bool
}

func (a *advertisementTap) add(p []byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.buf)+len(p) > maxAnswer {
		a.over = true
		return
	}
	a.buf = append(a.buf, p...)
}

// answer is the advertisement to keep, or nil: none whole, too large, or
// with a session id (transfer.advertiseSID: every session's differs).
func (a *advertisementTap) answer() []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	// Whole only if its pkt-lines end at their first flush exactly: the
	// tap may have stopped mid-write, and a "0000" inside a ref name or
	// an id is no end.
	if a.over || advertisementEnd(nil, a.buf) != len(a.buf) || bytes.Contains(a.buf, []byte("session-id=")) {
		return nil
	}
	return bytes.Clone(a.buf)
}

// clientBuffer reads a session's client stream in a goroutine of its own
// and keeps what it read: a follower compares it with a recording while
// waiting for the recording at the same time, and a git that takes over
// is fed all of it from the first byte (reader). It feeds the classifier
// (watch) as it reads, until close.
type clientBuffer struct {
	r       io.Reader
	total   atomic.Int64 // bytes read from the client
	mu      sync.Mutex
	cond    *sync.Cond
	data    []byte // read, from the first byte while kept (keep), else from the reader's position
	rpos    int    // reader's position in data
	keep    bool   // data keeps the first byte: someone still needs all of it (snapshot, attach)
	err     error  // how the client stream ended
	changed chan struct{}
	watch   io.Writer
	hook    func([]byte)
	closed  bool
}

// maxUnread bounds what clientBuffer holds ahead of its consumer.
const maxUnread = 4 << 20

func newClientBuffer(r io.Reader, watch io.Writer) *clientBuffer {
	b := &clientBuffer{r: r, watch: watch, changed: make(chan struct{}), keep: true}
	b.cond = sync.NewCond(&b.mu)
	return b
}

func (b *clientBuffer) run() {
	buf := make([]byte, 32<<10)
	for {
		n, err := b.r.Read(buf)
		b.mu.Lock()
		for len(b.data)-b.rpos > maxUnread && !b.closed {
			b.cond.Wait()
		}
		if b.closed {
			b.mu.Unlock()
			return
		}
		if n > 0 {
			if b.watch != nil {
				b.watch.Write(buf[:n])
			}
			if b.hook != nil {
				b.hook(buf[:n])
			}
			b.data = append(b.data, buf[:n]...)
			b.total.Add(int64(n))
		}
		if err != nil {
			b.err = err
		}
		b.notifyLocked()
		b.mu.Unlock()
		if err != nil {
			return
		}
	}
}

func (b *clientBuffer) notifyLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
	b.cond.Broadcast()
}

// snapshot is everything the client sent so far (until release), how
// its stream ended if it did, and a channel closed on change.
func (b *clientBuffer) snapshot() ([]byte, error, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.data[:len(b.data):len(b.data)], b.err, b.changed
}

// attach has hook see every byte the client sent, those already read
// first; it runs under the buffer's lock.
func (b *clientBuffer) attach(hook func([]byte)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	hook(b.data)
	b.hook = hook
}

// release lets the reader drop what it consumed: nobody needs the
// stream from its first byte any more.
func (b *clientBuffer) release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.keep = false
}

// close stops feeding the classifier and ends reader and waits.
func (b *clientBuffer) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		b.closed, b.watch, b.hook = true, nil, nil
		b.notifyLocked()
	}
}

// reader consumes the buffer: all the client sent from its first byte,
// then what it sends, then how its stream ended.
func (b *clientBuffer) reader() io.Reader { return bufferReader{b} }

type bufferReader struct{ b *clientBuffer }

func (r bufferReader) Read(p []byte) (int, error) {
	b := r.b
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.rpos == len(b.data) && b.err == nil && !b.closed {
		b.cond.Wait()
	}
	if b.rpos < len(b.data) {
		n := copy(p, b.data[b.rpos:])
		b.rpos += n
		if !b.keep {
			b.data, b.rpos = b.data[b.rpos:], 0
		}
		b.cond.Broadcast()
		return n, nil
	}
	if b.err != nil {
		return 0, b.err
	}
	return 0, io.EOF
}

type openingStatus int

const (
	openingComplete    openingStatus = iota
	openingUncacheable               // too large, or not pkt-lines
	openingGone                      // the client's stream ended first (or the session did)
	openingIdle                      // the wait's time limit passed
)

// waitOpening waits for the client's opening (openingScanner) and returns
// it. limit > 0 bounds the wait (openingIdle).
func (b *clientBuffer) waitOpening(ctx context.Context, limit time.Duration) ([]byte, openingStatus) {
	var timeout <-chan time.Time
	if limit > 0 {
		t := time.NewTimer(limit)
		defer t.Stop()
		timeout = t.C
	}
	// One scanner for the whole wait: a client that trickles its opening a
	// byte at a time costs one pass over it, not one per byte.
	var scan openingScanner
	for {
		data, err, changed := b.snapshot()
		n, status := scan.scan(data)
		switch {
		case status == openingComplete:
			return data[:n], status
		case status == openingUncacheable || len(data) > MaxCachedBody:
			return nil, openingUncacheable
		case err != nil:
			return nil, openingGone
		}
		b.mu.Lock()
		closed := b.closed
		b.mu.Unlock()
		if closed {
			return nil, openingGone
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, openingGone
		case <-timeout:
			return nil, openingIdle
		}
	}
}

// openingScanner finds the end of a v0/v1 client's opening: all it sends
// before it needs an answer beyond the advertisement. That is its want
// section and its first batch of haves, to the second flush (the client
// sends a second batch before it reads the ACKs of the first), or to done;
// a flush alone (ls-remote) or a want section that asks for shallow lines
// (deepen), which the client waits for, ends at its flush. It is fed the
// client's stream from its first byte, growing, and resumes after the
// last whole pkt-line it saw. openingGone from scan means not complete yet.
type openingScanner struct {
	pos            int // after the last whole pkt-line seen
	flushes        int
	wants, deepens bool
}

func (s *openingScanner) scan(data []byte) (int, openingStatus) {
	for {
		if len(data)-s.pos < 4 {
			return 0, openingGone
		}
		n, err := pktline.ParseLength(data[s.pos : s.pos+4])
		if err != nil || n == 1 || n == 2 || n == 3 || n > pktline.MaxLength {
			return 0, openingUncacheable
		}
		size := max(n, 4)
		if len(data)-s.pos < size {
			return 0, openingGone
		}
		line := bytes.TrimSuffix(data[s.pos+4:s.pos+size], []byte("\n"))
		s.pos += size
		switch {
		case n == 0:
			s.flushes++
			if s.flushes == 2 || !s.wants || s.deepens {
				return s.pos, openingComplete
			}
		case string(line) == "done":
			return s.pos, openingComplete
		case bytes.HasPrefix(line, []byte("want ")):
			s.wants = true
		case bytes.HasPrefix(line, []byte("deepen")):
			s.deepens = true
		}
	}
}
