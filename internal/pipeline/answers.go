package pipeline

import (
	"bytes"
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"packwire/internal/fetchcache"
	"packwire/internal/gitexec"
	"packwire/internal/repostate"
)

// answerCache keeps git's small answers that depend only on the request
// and the repository's state: v2 capability advertisements, v2 ls-refs
// responses and v0/v1 ref advertisements. Each costs a git process of a
// few milliseconds, which after a push dominated a herd of CI fetches (the
// fetch itself is shared by the fetch cache). An answer is keyed on the
// git command line (every -c setting: hidden refs are git's config), the
// protocol, the principal, the repository's stamp and the request, and is
// kept only for a stamp that is not racy, so a push is seen by the first
// request after it. Identical requests that arrive while git runs wait for
// its answer instead of running git too.
type answerCache struct {
	mu      sync.Mutex
	entries map[string]*list.Element // of *answerEntry, least recently used at the back
	lru     list.List
	bytes   int64
	flights map[string]*answerFlight
}

type answerEntry struct {
	key  string
	body []byte
}

// answerFlight is a git run whose answer others wait for.
type answerFlight struct {
	done chan struct{}
	body []byte // set before done closes; nil: no usable answer
}

const (
	// maxAnswer bounds one kept answer: a 5,000-ref advertisement is about
	// 300 KiB; a larger one is passed through and not kept.
	maxAnswer = 8 << 20
	// maxAnswerBytes bounds the cache; the least recently used go first.
	maxAnswerBytes = 64 << 20
)

// lookup returns a kept answer, or a run to wait for, or (both nil) makes
// the caller the run of key: it must call finish.
func (c *answerCache) lookup(key string) ([]byte, *answerFlight) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[key]; ok {
		c.lru.MoveToFront(e)
		return e.Value.(*answerEntry).body, nil
	}
	if f, ok := c.flights[key]; ok {
		return nil, f
	}
	if c.flights == nil {
		c.flights = map[string]*answerFlight{}
		c.entries = map[string]*list.Element{}
	}
	c.flights[key] = &answerFlight{done: make(chan struct{})}
	return nil, nil
}

// finish ends the run of key: body (nil: none) is kept and handed to
// those waiting.
func (c *answerCache) finish(key string, body []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := c.flights[key]
	delete(c.flights, key)
	if body != nil {
		c.entries[key] = c.lru.PushFront(&answerEntry{key: key, body: body})
		c.bytes += int64(len(body))
		for c.bytes > maxAnswerBytes {
			old := c.lru.Remove(c.lru.Back()).(*answerEntry)
			delete(c.entries, old.key)
			c.bytes -= int64(len(old.body))
		}
	}
	if f != nil {
		f.body = body
		close(f.done)
	}
}

// answerKey names an answer: what git is run as and for whom, the
// repository's state and the request.
func answerKey(kind string, args []string, spec gitexec.Spec, user, stamp string, request []byte) string {
	h := sha256.New()
	for _, part := range []string{kind, strings.Join(args, "\x00"), spec.Protocol, user, stamp} {
		fmt.Fprintf(h, "%d:%s\x00", len(part), part)
	}
	h.Write(request)
	return hex.EncodeToString(h.Sum(nil))
}

// cachedAnswer answers request (git's stdin, whole) from the answer cache
// for the repository state st, or runs git for it and keeps the answer if
// keep says it may be kept. A racy stamp neither reads nor keeps: git runs
// as without the cache.
func (c *Call) cachedAnswer(ctx context.Context, kind string, spec gitexec.Spec, st repostate.Stamp, request, key []byte, keep func([]byte) bool, stdout, stderr io.Writer) (gitexec.Result, error) {
	p := c.p
	if st.Digest == "" || st.Racy {
		return c.startGit(ctx, spec, bytes.NewReader(request), stdout, stderr)
	}
	k := answerKey(kind, p.Runner.Args(spec), spec, c.Request.Principal.User, st.Digest, key)
	body, wait := p.answers.lookup(k)
	if wait != nil {
		select {
		case <-wait.done:
			body = wait.body
		case <-ctx.Done():
			return gitexec.Result{}, context.Cause(ctx)
		}
	}
	if body != nil {
		if c.Request.StatelessRPC {
			c.setOutcome(fetchcache.Replayed) // one request, one answer: it was replayed
		}
		return writeAnswer(ctx, body, stdout, spec.Progress, int64(len(request)), c.timeouts.Idle)
	}
	if wait != nil {
		// The run waited for gave nothing to keep: run git as without the cache.
		return c.startGit(ctx, spec, bytes.NewReader(request), stdout, stderr)
	}
	// This request runs git for everyone asking the same meanwhile. git's
	// answer is collected before it goes out, so a slow client of the run
	// holds up nobody else; one too large to keep passes through.
	capture := &answerWriter{w: stdout, release: func() { p.answers.finish(k, nil) }}
	res, err := c.startGit(ctx, spec, bytes.NewReader(request), capture, stderr)
	if capture.passing {
		return res, err
	}
	out := capture.buf.Bytes()
	if err == nil && res.ExitCode == 0 && bytes.HasSuffix(out, []byte("0000")) && (keep == nil || keep(out)) {
		p.answers.finish(k, out)
	} else {
		p.answers.finish(k, nil)
	}
	if len(out) == 0 {
		return res, err
	}
	wres, werr := writeAnswer(ctx, out, stdout, nil, 0, c.timeouts.Idle)
	if err == nil {
		err = werr
	}
	res.BytesOut = wres.BytesOut
	return res, err
}

// answerWriter collects git's answer up to maxAnswer; beyond it, it
// releases those waiting (release) and passes everything through.
type answerWriter struct {
	w       io.Writer
	buf     bytes.Buffer
	passing bool
	release func()
}

func (a *answerWriter) Write(b []byte) (int, error) {
	if !a.passing && a.buf.Len()+len(b) <= maxAnswer {
		return a.buf.Write(b)
	}
	if !a.passing {
		a.passing = true
		a.release()
		if _, err := a.w.Write(a.buf.Bytes()); err != nil {
			return 0, err
		}
		a.buf = bytes.Buffer{}
	}
	return a.w.Write(b)
}

// SetWriteDeadline lets a kill cut short a write to a stalled client.
func (a *answerWriter) SetWriteDeadline(t time.Time) error {
	if d, ok := a.w.(gitexec.WriteDeadliner); ok {
		return d.SetWriteDeadline(t)
	}
	return nil
}

// writeAnswer sends a kept answer to the client, within the idle timeout
// per write and never after ctx ends (a client that stopped reading).
func writeAnswer(ctx context.Context, body []byte, stdout io.Writer, progress *gitexec.Progress, bytesIn int64, idle time.Duration) (gitexec.Result, error) {
	if d, ok := stdout.(gitexec.WriteDeadliner); ok {
		if idle > 0 {
			d.SetWriteDeadline(time.Now().Add(idle))
		}
		defer gitexec.DeadlineOnCancel(ctx, d.SetWriteDeadline)()
	}
	n, err := stdout.Write(body)
	if progress != nil {
		progress.BytesIn.Add(bytesIn)
		progress.BytesOut.Add(int64(n))
	}
	res := gitexec.Result{BytesIn: bytesIn, BytesOut: int64(n)}
	if err != nil {
		if ctx.Err() != nil {
			return res, context.Cause(ctx)
		}
		return res, fmt.Errorf("%w: %v", gitexec.ErrClientGone, err)
	}
	return res, nil
}
