package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

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
// stateless protocol v2 upload-pack command (smart HTTP POST) that is not
// ls-refs. Its admission waits until the body says whether git will run.
func (p *Pipeline) usesFetchCache(req Request) bool {
	return p.FetchCache != nil && req.StatelessRPC && req.Service == gitexec.UploadPack &&
		!req.AdvertiseRefs && protocol.Version(req.Protocol) == 2
}

// runFetch serves a stateless v2 fetch, whose body was read whole,
// through the fetch cache: a stored response is replayed and a run in
// progress followed, with no git and no limiter slot (a replay costs a
// file read, not a pack); otherwise this request takes a slot and runs
// git, sharing its output with every identical request that arrives
// meanwhile.
func (c *Call) runFetch(ctx context.Context, spec gitexec.Spec, body []byte, stdout, stderr io.Writer) (gitexec.Result, error) {
	p := c.p
	if err := fetchcache.Check(body); err != nil {
		return c.runUncached(ctx, spec, bytes.NewReader(body), stdout, stderr)
	}
	stamp, err := repostate.Refs(c.Repo.Path, time.Now())
	if err != nil || stamp.Racy {
		// A ref changed a moment ago: another change now could leave the
		// same stamp, so this request neither stores nor replays.
		return c.runUncached(ctx, spec, bytes.NewReader(body), stdout, stderr)
	}
	key := p.FetchCache.Key([]byte(strings.Join(p.Runner.Args(spec), "\x00")), []byte(spec.Protocol), []byte(stamp.Digest), body)
	reader, writer, err := p.FetchCache.Join(key)
	if err != nil {
		return c.runUncached(ctx, spec, bytes.NewReader(body), stdout, stderr)
	}
	out := newProgressWriter(stdout, spec.Progress)
	if spec.Progress != nil {
		spec.Progress.BytesIn.Add(int64(len(body)))
	}
	if writer == nil {
		written, err := reader.Replay(ctx, out, p.Runner.IdleTimeout)
		reader.Close()
		if errors.Is(err, fetchcache.ErrGenerationFailed) && written == 0 {
			// The run this request waited for failed before sending it
			// anything: run git itself, as without the cache.
			if spec.Progress != nil {
				spec.Progress.BytesIn.Add(-int64(len(body)))
			}
			return c.runUncached(ctx, spec, bytes.NewReader(body), stdout, stderr)
		}
		c.outcome = fetchcache.Replayed
		return gitexec.Result{BytesIn: int64(len(body)), BytesOut: written}, err
	}
	return c.lead(ctx, spec, body, reader, writer, out)
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
	spec.OutputTap = nil // "done" was sent: the kind needs no look at the answer
	spec.Progress = nil  // out counts what reaches this client
	type outcome struct {
		res gitexec.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := p.Runner.Run(runCtx, spec, bytes.NewReader(body), nil, nil)
		failed := err
		if failed == nil && res.ExitCode != 0 {
			failed = fmt.Errorf("git exited with status %d: %s", res.ExitCode, res.Stderr)
		}
		writer.Finish(failed)
		done <- outcome{res, err}
	}()
	written, replayErr := reader.Replay(ctx, out, p.Runner.IdleTimeout)
	reader.Close()
	run := <-done
	c.outcome = fetchcache.Generated
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
	return c.p.Runner.Run(ctx, spec, stdin, stdout, stderr)
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
	release, waited, err := lim.Acquire(ctx, c.Repo.Name)
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
