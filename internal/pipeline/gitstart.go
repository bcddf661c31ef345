package pipeline

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"packwire/internal/gitexec"
)

// startGit is the one place a request starts git (the reach checker's
// helpers aside). Every start is paid for by a read of the client's that
// delivered new bytes, the request itself paying for the first: a request
// starts at most 1 + (such reads) gits. A session that answers command
// after command then cannot start git in a loop without its client
// sending more; a bug that would (a malformed packet left unread and
// peeked again, as once) fails closed with ErrGitWithoutInput instead.
func (c *Call) startGit(ctx context.Context, spec gitexec.Spec, stdin io.Reader, stdout, stderr io.Writer) (gitexec.Result, error) {
	p := c.p
	reads := c.input.Reads()
	if n := c.gitStarts.Add(1); n > 1+reads {
		c.gitStarts.Add(-1)
		p.log().Error("refused to start git: no new client input since the last start (a bug)", "id", c.ID,
			"transport", c.Request.Transport, "repo", c.Repo.Name, "starts", n-1, "client_reads", reads)
		return gitexec.Result{}, &Error{Code: CodeInternal, Message: "internal error: the session wanted git again without new input", Err: ErrGitWithoutInput}
	}
	p.gitStarts.Add(1)
	if p.spawn != nil {
		return p.spawn(ctx, spec, stdin, stdout, stderr)
	}
	runner := *p.Runner
	runner.IdleTimeout = c.timeouts.Idle // the request's, from Prepare
	return runner.Run(ctx, spec, stdin, stdout, stderr)
}

// ErrGitWithoutInput is the cause of a git start refused by startGit.
var ErrGitWithoutInput = errors.New("git start without new client input")

// GitStarts is the number of git processes requests started (startGit).
func (p *Pipeline) GitStarts() int64 { return p.gitStarts.Load() }

// clientInput is the client's stream as a request reads it. It counts the
// reads that delivered bytes (what pays for startGit) and when the last
// did (a sign of life for idleWatch). A nil clientInput has no reads.
type clientInput struct {
	r     io.Reader
	reads atomic.Int64
}

func (c *clientInput) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.reads.Add(1)
	}
	return n, err
}

// Reads is the number of reads that delivered bytes so far.
func (c *clientInput) Reads() int64 {
	if c == nil {
		return 0
	}
	return c.reads.Load()
}

// idleWatch ends a git:// or SSH session (cancel, with gitexec.ErrIdle)
// once nothing moved either way for idle, whatever the session is doing:
// waiting for a command, answering from a cache, queueing, or looping by
// mistake. moved is the session's count of what moved (client reads that
// delivered bytes, bytes sent). git's own runs have the same bound
// (gitexec.Runner.IdleTimeout); this one also holds between them.
//
// It checks on a timer four times per idle period rather than after every
// read or write: a session costs one timer, and ends within 1.25 x idle.
func idleWatch(idle time.Duration, moved func() int64, cancel context.CancelCauseFunc) (stop func()) {
	if idle <= 0 {
		return func() {}
	}
	var (
		mu      sync.Mutex
		stopped bool
		timer   *time.Timer
		last    = moved()
		since   = time.Now()
	)
	check := func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		if now := moved(); now != last {
			last, since = now, time.Now()
		} else if time.Since(since) >= idle {
			cancel(gitexec.ErrIdle)
			return
		}
		timer.Reset(idle / 4)
	}
	mu.Lock()
	timer = time.AfterFunc(idle/4, check)
	mu.Unlock()
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		timer.Stop()
	}
}
