package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"packwire/internal/clonepack"
	"packwire/internal/fetchcache"
	"packwire/internal/gitexec"
	"packwire/internal/limiter"
	"packwire/internal/protocol"
	"packwire/internal/repostate"
)

// MaxCachedBody bounds the request body read ahead for the fetch cache. A
// clone's request is a few KiB (one want per branch and tag); a larger
// body is streamed to git as it comes and never cached.
const MaxCachedBody = 1 << 20

// usesFetchCache tells whether a request goes through the fetch cache: a
// stateless upload-pack request (smart HTTP POST: a v0/v1 request, a v2
// command). Its admission waits until the body says whether git will run.
// (git:// and SSH sessions go through it at their admission gate, see
// sessionFetch.)
func (p *Pipeline) usesFetchCache(req Request) bool {
	return p.FetchCache != nil && req.StatelessRPC && req.Service == gitexec.UploadPack && !req.AdvertiseRefs
}

// runFetch serves a stateless fetch, whose body was read whole, through
// the fetch cache (cachedFetch), or runs git as without it.
func (c *Call) runFetch(ctx context.Context, spec gitexec.Spec, body []byte, stdout, stderr io.Writer) (gitexec.Result, error) {
	req, err := fetchcache.Inspect(body, protocol.Version(spec.Protocol) == 2)
	if err != nil {
		return c.runUncached(ctx, spec, bytes.NewReader(body), stdout, stderr)
	}
	stamp, err := repostate.Refs(c.Repo.Path, time.Now())
	if err != nil || stamp.Racy {
		// A ref changed a moment ago: another change now could leave the
		// same stamp, so this request neither stores nor replays.
		return c.runUncached(ctx, spec, bytes.NewReader(body), stdout, stderr)
	}
	res, served, err := c.cachedFetch(ctx, spec, body, req, stamp.Digest, stdout)
	if !served {
		return c.runUncached(ctx, spec, bytes.NewReader(body), stdout, stderr)
	}
	return res, err
}

// cachedFetch answers a whole fetch request (body, inspected as req)
// through the fetch cache, for the repository state stamp: a stored
// response is replayed and a run in progress followed, with no git and no
// limiter slot (a replay costs a file read, not a pack); otherwise this
// request takes a slot and runs a stateless git on body, sharing its
// output with every identical request that arrives meanwhile. The key is
// that of a stateless run whatever the transport, so git:// and SSH
// sessions and smart HTTP share entries: git's answer to a whole request
// is the same bytes in a session as over HTTP. served false: nothing was
// sent, run git as without the cache.
func (c *Call) cachedFetch(ctx context.Context, spec gitexec.Spec, body []byte, req fetchcache.Request, stamp string, stdout io.Writer) (res gitexec.Result, served bool, err error) {
	p := c.p
	if clone, pack := c.exactPack(spec, body); pack != nil {
		res, err := c.sendPack(ctx, spec, body, clone, pack, stdout)
		return res, true, err
	}
	spec.StatelessRPC, spec.AdvertiseRefs = true, false
	key := p.FetchCache.Key([]byte(strings.Join(p.Runner.Args(spec), "\x00")), []byte(spec.Protocol), []byte(stamp), req.Key)
	join := p.FetchCache.Join
	if req.Haves > 0 {
		join = p.FetchCache.JoinIncremental
	}
	reader, writer, err := join(key)
	if err != nil {
		return gitexec.Result{}, false, nil
	}
	out := newProgressWriter(stdout, spec.Progress)
	if spec.Progress != nil {
		spec.Progress.BytesIn.Add(int64(len(body)))
	}
	if writer == nil {
		written, err := reader.Replay(ctx, out, c.timeouts.Idle)
		tapHead(reader, written, spec.OutputTap)
		reader.Close()
		if errors.Is(err, fetchcache.ErrGenerationFailed) && written == 0 {
			// The run this request waited for failed before sending it
			// anything: run git itself, as without the cache.
			if spec.Progress != nil {
				spec.Progress.BytesIn.Add(-int64(len(body)))
			}
			return gitexec.Result{}, false, nil
		}
		c.setOutcome(fetchcache.Replayed)
		return gitexec.Result{BytesIn: int64(len(body)), BytesOut: written}, true, err
	}
	if ans, err := c.cloneAnswer(ctx, spec, body); ans.answer != nil || err != nil {
		if err != nil { // refused admission
			writer.Finish(err)
			reader.Close()
			return gitexec.Result{}, true, err
		}
		res, err = c.leadFromPack(ctx, body, ans, reader, writer, out, spec.OutputTap)
		return res, true, err
	}
	res, err = c.lead(ctx, spec, body, reader, writer, out)
	return res, true, err
}

// packAnswer is a clone's answer spliced from the preferred pack and
// what was pushed since (internal/clonepack).
type packAnswer struct {
	clone   clonepack.Clone
	answer  *clonepack.Splice
	outcome string
	cost    gitexec.Result // the splice's git
}

// cloneAnswer returns the splice answering body when body is a plain
// full clone and the pushes since the preferred pack was built only
// added; none: git answers. A splice runs git (the thin pack), so it
// takes a limiter slot first; a refusal is the error.
func (c *Call) cloneAnswer(ctx context.Context, spec gitexec.Spec, body []byte) (packAnswer, error) {
	clone, err := clonepack.Parse(body, protocol.Version(spec.Protocol) == 2)
	if err != nil {
		return packAnswer{}, nil
	}
	var refused error
	sp, err := clonepack.OpenSplice(ctx, c.Repo.Path, clone, func() error {
		refused = c.admitNow(ctx, c.p.Limiter)
		return refused
	})
	switch {
	case refused != nil:
		return packAnswer{}, refused
	case err != nil:
		return packAnswer{}, nil
	}
	return packAnswer{clone: clone, answer: sp, outcome: clonepack.SpliceOutcome,
		cost: gitexec.Result{UserCPU: sp.UserCPU, SysCPU: sp.SysCPU}}, nil
}

// exactPack opens the repository's preferred pack when it is the whole
// answer to body, a plain full clone of exactly the tips it was built
// from (internal/clonepack); nil: the fetch cache and git answer.
func (c *Call) exactPack(spec gitexec.Spec, body []byte) (clonepack.Clone, *clonepack.Pack) {
	clone, err := clonepack.Parse(body, protocol.Version(spec.Protocol) == 2)
	if err != nil {
		return clone, nil
	}
	pack, err := clonepack.Open(c.Repo.Path, clone)
	if err != nil {
		return clone, nil
	}
	return clone, pack
}

// sendPack answers with the preferred pack itself, framed on its way to
// the client: no git, no limiter slot, and not through the fetch cache's
// file, since a copy of the pack costs what a replay of it would (writing
// it into the cache file first was a quarter of the CPU). Identical clones
// at once each read the pack; the page cache shares it.
func (c *Call) sendPack(ctx context.Context, spec gitexec.Spec, body []byte, clone clonepack.Clone, pack *clonepack.Pack, stdout io.Writer) (gitexec.Result, error) {
	defer pack.Close()
	if spec.Progress != nil {
		spec.Progress.BytesIn.Add(int64(len(body)))
	}
	out := &deadlineWriter{w: newProgressWriter(stdout, spec.Progress), idle: c.timeouts.Idle}
	if d, ok := stdout.(gitexec.WriteDeadliner); ok {
		out.d = d
		defer gitexec.DeadlineOnCancel(ctx, d.SetWriteDeadline)()
	}
	if spec.OutputTap != nil {
		out.tap, out.tapLeft = spec.OutputTap, 64<<10
	}
	written, err := pack.WriteResponse(out, clone)
	c.setOutcome(clonepack.Outcome)
	res := gitexec.Result{BytesIn: int64(len(body)), BytesOut: written}
	if err != nil {
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		return res, errors.Join(gitexec.ErrClientGone, err)
	}
	return res, nil
}

// deadlineWriter bounds each write by idle (a client that stops reading
// is cut off as git's relay cuts it off) and shows the start of what it
// writes to the classifier's tap.
type deadlineWriter struct {
	w       io.Writer
	d       gitexec.WriteDeadliner
	idle    time.Duration
	tap     io.Writer
	tapLeft int
}

func (w *deadlineWriter) Write(p []byte) (int, error) {
	if w.tapLeft > 0 {
		n := min(len(p), w.tapLeft)
		w.tap.Write(p[:n])
		w.tapLeft -= n
	}
	if w.d != nil && w.idle > 0 {
		w.d.SetWriteDeadline(time.Now().Add(w.idle))
	}
	return w.w.Write(p)
}

// leadFromPack is lead with the preferred pack for git: the answer is
// written into the fetch cache's file by a copy in large chunks (no git
// process for the pack itself, no limiter slot unless a splice ran git:
// it costs a file copy, as a replay does), and this request's client,
// like every follower, reads it from there.
func (c *Call) leadFromPack(ctx context.Context, body []byte, ans packAnswer, reader *fetchcache.Reader, writer *fetchcache.Writer, out io.Writer, tap io.Writer) (gitexec.Result, error) {
	runCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stopKill := context.AfterFunc(c.p.killCtx, cancel)
	defer stopKill()
	writer.OnAbandon(cancel)
	done := make(chan error, 1)
	go func() {
		defer ans.answer.Close()
		_, err := ans.answer.WriteResponse(ctxWriter{runCtx, writer}, ans.clone)
		writer.Finish(err)
		done <- err
	}()
	written, replayErr := reader.Replay(ctx, out, c.timeouts.Idle)
	tapHead(reader, written, tap)
	reader.Close()
	runErr := <-done
	c.setOutcome(ans.outcome)
	res := ans.cost
	res.BytesIn, res.BytesOut = int64(len(body)), written
	switch {
	case replayErr != nil && !errors.Is(replayErr, fetchcache.ErrGenerationFailed):
		return res, replayErr
	case runErr != nil && ctx.Err() != nil:
		return res, ctx.Err()
	default:
		return res, runErr
	}
}

// ctxWriter stops a copy once ctx ends (every reader left).
type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (w ctxWriter) Write(p []byte) (int, error) {
	if err := w.ctx.Err(); err != nil {
		return 0, err
	}
	return w.w.Write(p)
}

// tapHead shows the start of a response that went out from the cache's
// file to the classifier's tap, which tells a negotiation round that got
// its pack ("ready") from one that did not by the answer's first section.
func tapHead(reader *fetchcache.Reader, written int64, tap io.Writer) {
	if tap == nil || written <= 0 {
		return
	}
	head := make([]byte, min(written, 64<<10))
	n, _ := reader.ReadAt(head, 0)
	tap.Write(head[:n])
}

// setOutcome records how the fetch cache served a request. A session may
// send several fetch commands: it counts as generated if any ran git.
func (c *Call) setOutcome(outcome string) {
	if c.outcome != fetchcache.Generated {
		c.outcome = outcome
	}
}

// sessionFetch answers a whole fetch request of a git:// or SSH session
// (a v2 fetch command, or a v0/v1 request from its first want to done)
// through the fetch cache, for the admission gate. It returns handled
// false when the cache cannot serve it: the session's git answers it then.
//
// A v0/v1 request answers the advertisement the session's git sent at its
// start: the wants are the refs it listed, and upload-pack serves
// (include-tag, ACKs) from what it read then. So such a request is keyed
// on the repository state stamped before git started (sessionStamp), and
// only while that state still holds: if a push landed since, git answers
// as without the cache, consistent with its advertisement, and the next
// session sees the push. A v2 fetch names its objects itself and is
// keyed on the state now, as over HTTP.
func (c *Call) sessionFetch(ctx context.Context, spec gitexec.Spec, v2 bool, sessionStamp repostate.Stamp, body []byte, stdout io.Writer) (bool, error) {
	req, err := fetchcache.Inspect(body, v2)
	if err != nil || !v2 && (req.Shallow || req.Round) {
		return false, nil
	}
	stamp, err := repostate.Refs(c.Repo.Path, time.Now())
	if err != nil || stamp.Racy {
		return false, nil
	}
	if !v2 && (sessionStamp.Digest == "" || sessionStamp.Racy || stamp.Digest != sessionStamp.Digest) {
		return false, nil
	}
	spec.OutputTap = nil
	res, served, err := c.cachedFetch(ctx, spec, body, req, stamp.Digest, stdout)
	if !served {
		return false, nil
	}
	c.side.add(res)
	return true, err
}

// sideRuns sums what a session's fetch cache answers cost and moved
// besides its own git: the governor record has one line per session.
type sideRuns struct {
	mu                sync.Mutex
	user, sys         time.Duration
	maxRSS            int64
	bytesIn, bytesOut int64
	exitCode          int
}

func (s *sideRuns) add(res gitexec.Result) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.user += res.UserCPU
	s.sys += res.SysCPU
	s.maxRSS = max(s.maxRSS, res.MaxRSS)
	s.bytesIn += res.BytesIn
	s.bytesOut += res.BytesOut
	if res.ExitCode != 0 {
		s.exitCode = res.ExitCode
	}
}

// fold adds the side runs into res, the session git's result.
func (s *sideRuns) fold(res gitexec.Result) gitexec.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	res.UserCPU += s.user
	res.SysCPU += s.sys
	res.MaxRSS = max(res.MaxRSS, s.maxRSS)
	res.BytesIn += s.bytesIn
	res.BytesOut += s.bytesOut
	if res.ExitCode == 0 {
		res.ExitCode = s.exitCode
	}
	return res
}

// lead runs git for a key nobody has: git writes into the cache's file,
// and this request's client, like every follower, reads it from there. So
// git runs at its own pace whatever the clients', and keeps running while
// any reader is left: the leader's client leaving does not stop the
// followers. When the last reader leaves early, git is killed. The
// request returns once git has exited, so its record has git's cost and
// its limiter slot is held exactly while git runs.
func (c *Call) lead(ctx context.Context, spec gitexec.Spec, body []byte, reader *fetchcache.Reader, writer *fetchcache.Writer, out io.Writer) (gitexec.Result, error) {
	p := c.p
	if err := c.admitNow(ctx, p.Limiter); err != nil {
		writer.Finish(err)
		reader.Close()
		return gitexec.Result{}, err
	}
	// Detached from this request (but not from the server's kill switch).
	runCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stopKill := context.AfterFunc(p.killCtx, cancel)
	defer stopKill()
	writer.OnAbandon(cancel)

	// git writes its answer straight into the cache's file: no copy of it
	// passes through packwire on the way in, and every reader (this
	// request's client too) sends it from there, with sendfile where the
	// transport can.
	spec.OutputFile = writer.File()
	tap := spec.OutputTap // shown the answer from the file (tapHead)
	spec.OutputTap = nil
	spec.Progress = nil // out counts what reaches this client
	type outcome struct {
		res gitexec.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := c.startGit(runCtx, spec, bytes.NewReader(body), nil, nil)
		failed := err
		if failed == nil && res.ExitCode != 0 {
			failed = fmt.Errorf("git exited with status %d: %s", res.ExitCode, res.Stderr)
		}
		writer.Finish(failed)
		done <- outcome{res, err}
	}()
	written, replayErr := reader.Replay(ctx, out, c.timeouts.Idle)
	tapHead(reader, written, tap)
	reader.Close()
	run := <-done
	c.setOutcome(fetchcache.Generated)
	res := run.res
	res.BytesIn, res.BytesOut = int64(len(body)), written
	switch {
	case replayErr != nil && !errors.Is(replayErr, fetchcache.ErrGenerationFailed):
		return res, replayErr // this client left (or was cut off)
	case run.err != nil && ctx.Err() != nil:
		return res, ctx.Err()
	default:
		return res, run.err
	}
}

// runUncached runs git as without the cache, once it has a limiter slot.
func (c *Call) runUncached(ctx context.Context, spec gitexec.Spec, stdin io.Reader, stdout, stderr io.Writer) (gitexec.Result, error) {
	if err := c.admitNow(ctx, c.p.Limiter); err != nil {
		return gitexec.Result{}, err
	}
	return c.startGit(ctx, spec, stdin, stdout, stderr)
}

// admitNow takes a slot of lim (the pipeline's Limiter, or Pushes) for a
// request that deferred it at Prepare; it is released when the request
// ends. A request holds one slot at most.
func (c *Call) admitNow(ctx context.Context, lim *limiter.Limiter) error {
	c.admitMu.Lock()
	held, ended := c.release != nil, c.ended
	c.admitMu.Unlock()
	switch {
	case lim == nil || held:
		return nil
	case ended:
		return &Error{Code: CodeUnavailable, Message: "request ended while queued", Err: context.Canceled}
	}
	client := clientKey(c.Request)
	if c.Request.Principal.IsCluster() {
		client = "" // a node's replication: counted where the client pushed
	}
	release, waited, err := lim.AcquireFor(ctx, c.Repo.Name, client)
	c.admitMu.Lock()
	c.queueWait += waited
	if err == nil && c.ended {
		c.admitMu.Unlock()
		release() // the request ended while this waited
		return &Error{Code: CodeUnavailable, Message: "request ended while queued", Err: context.Canceled}
	}
	if err == nil {
		c.release = release
	}
	c.admitMu.Unlock()
	var busy *limiter.BusyError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &busy):
		return &Error{Code: CodeUnavailable, Message: busy.Error(), Err: err, RetryAfter: busy.RetryAfter}
	default:
		return &Error{Code: CodeUnavailable, Message: "request cancelled while queued", Err: err}
	}
}

// waited is how long the call has queued for its limiter slot so far.
func (c *Call) waited() time.Duration {
	c.admitMu.Lock()
	defer c.admitMu.Unlock()
	return c.queueWait
}

// progressWriter counts what reaches the client for views of running
// requests.
type progressWriter struct {
	w        io.Writer
	progress *gitexec.Progress
}

// newProgressWriter wraps w; when w can send files itself (the HTTP
// transport, with sendfile), the wrapper passes that on, otherwise the
// replay copies through Write.
func newProgressWriter(w io.Writer, progress *gitexec.Progress) io.Writer {
	p := &progressWriter{w: w, progress: progress}
	if files, ok := w.(fileSender); ok {
		return &progressFileWriter{progressWriter: p, files: files}
	}
	return p
}

func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.count(int64(n))
	return n, err
}

func (p *progressWriter) count(n int64) {
	if p.progress != nil {
		p.progress.BytesOut.Add(n)
	}
}

func (p *progressWriter) SetWriteDeadline(t time.Time) error {
	if d, ok := p.w.(gitexec.WriteDeadliner); ok {
		return d.SetWriteDeadline(t)
	}
	return nil
}

type fileSender interface {
	fetchcache.FileServer
	fetchcache.FileStreamer
}

// progressFileWriter is a progressWriter over a transport that sends
// files itself.
type progressFileWriter struct {
	*progressWriter
	files fileSender
}

// StreamDone is the transport's StreamDone where it has one, else its
// StreamFile.
func (p *progressFileWriter) StreamDone(f *os.File, n int64) (int64, error) {
	sent, err := fetchcache.StreamerFor(p.files, true)(f, n)
	p.count(sent)
	return sent, err
}

func (p *progressFileWriter) ServeFile(f *os.File, size int64) (int64, error) {
	n, err := p.files.ServeFile(f, size)
	p.count(n)
	if err == nil && n < size {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

func (p *progressFileWriter) StreamFile(f *os.File, n int64) (int64, error) {
	sent, err := p.files.StreamFile(f, n)
	p.count(sent)
	return sent, err
}
