package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// pusher is the study's writer: during fetch phases it changes three
// random files, commits and pushes to the branch at a fixed interval, so
// fetches download real data.
type pusher struct {
	c        *client
	dir      string
	url      string
	branch   string
	interval time.Duration

	files []string
	base  string // the branch before the first push
	rng   *rand.Rand
	n     int

	mu       sync.Mutex
	pushes   []Push
	ok, fail int
}

func (p *pusher) prepare(ctx context.Context) error {
	res := p.c.run(ctx, filepath.Dir(p.dir), "", "clone", "-q", "--branch", p.branch, "--", p.url, p.dir)
	if res.Err != nil {
		return fmt.Errorf("the pusher cannot clone %s: %v", RedactURL(p.url), res.Err)
	}
	out, err := p.c.output(ctx, p.dir, "ls-files")
	if err != nil {
		return fmt.Errorf("pusher: %v", err)
	}
	for _, f := range strings.Split(out, "\n") {
		if f != "" && !strings.HasPrefix(f, "\"") { // quoted names have odd characters; skip them
			p.files = append(p.files, f)
		}
	}
	if len(p.files) == 0 {
		p.files = []string{"packwire-bench/a.txt", "packwire-bench/b.txt", "packwire-bench/c.txt"}
	}
	p.base, _ = p.c.output(ctx, p.dir, "rev-parse", "HEAD")
	p.rng = rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 6))
	return nil
}

// start pushes once and returns when that push is on the server (or
// failed), then pushes every interval until the returned stop is called;
// stop waits for a push in flight and returns the phase's counts.
//
// The first push comes before the phase's clock starts, so that each
// user's first fetch has a pushed commit to download, whatever the load,
// the interval or the phase's length. Started with the fetches instead, it
// raced them: a phase of a few quick fetches, or a loaded machine where
// commit and push took longer than the phase, measured no-op fetches only.
func (p *pusher) start(ctx context.Context, phase string) (stop func() (ok, failed int)) {
	quit := make(chan struct{})
	done := make(chan struct{})
	okBefore, failBefore := p.counts()
	next := time.Now()
	p.pushOnce(ctx, phase)
	go func() {
		defer close(done)
		for {
			for next = next.Add(p.interval); !next.After(time.Now()); next = next.Add(p.interval) {
			}
			t := time.NewTimer(time.Until(next))
			select {
			case <-quit:
				t.Stop()
				return
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			select {
			case <-quit:
				return
			case <-ctx.Done():
				return
			default:
			}
			p.pushOnce(ctx, phase)
		}
	}()
	return func() (int, int) {
		close(quit)
		<-done
		ok, fail := p.counts()
		return ok - okBefore, fail - failBefore
	}
}

func (p *pusher) counts() (ok, failed int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ok, p.fail
}

// pushOnce changes three random files, commits and pushes.
func (p *pusher) pushOnce(ctx context.Context, phase string) {
	p.n++
	picked := map[string]bool{}
	for len(picked) < min(3, len(p.files)) {
		picked[p.files[p.rng.IntN(len(p.files))]] = true
	}
	var changed []string
	for f := range picked {
		path := filepath.Join(p.dir, filepath.FromSlash(f))
		os.MkdirAll(filepath.Dir(path), 0o755)
		fh, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			continue
		}
		fmt.Fprintf(fh, "packwire bench push %d %016x\n", p.n, p.rng.Uint64())
		fh.Close()
		changed = append(changed, f)
	}
	push := Push{Phase: phase, Start: time.Now()}
	commit := func() error {
		if r := p.c.run(ctx, p.dir, "", append([]string{"add", "--"}, changed...)...); r.Err != nil {
			return r.Err
		}
		if r := p.c.run(ctx, p.dir, "", "commit", "-q", "-m", fmt.Sprintf("packwire bench push %d", p.n)); r.Err != nil {
			return r.Err
		}
		return nil
	}
	err := commit()
	if err == nil {
		push.Commit, _ = p.c.output(ctx, p.dir, "rev-parse", "HEAD")
		push.Start = time.Now()
		r := p.c.run(ctx, p.dir, "", "push", "-q", "origin", "HEAD:refs/heads/"+p.branch)
		push.WallMS = ms(r.Wall)
		err = r.Err
	}
	push.End = time.Now()
	switch {
	case err == nil:
		push.Result = ResultOK
	case ctx.Err() != nil:
		push.Result = ResultCanceled
	default:
		push.Result, push.Error = ResultError, err.Error()
		// Start again from what the server has: the failed commit is
		// counted as failed, never as lost.
		if r := p.c.run(ctx, p.dir, "", "fetch", "-q", "origin", p.branch); r.Err == nil {
			p.c.run(ctx, p.dir, "", "reset", "-q", "--hard", "FETCH_HEAD")
		}
	}
	p.mu.Lock()
	p.pushes = append(p.pushes, push)
	switch push.Result {
	case ResultOK:
		p.ok++
	case ResultError:
		p.fail++
	}
	p.mu.Unlock()
}

// verify fetches the branch from the server and checks that every pushed
// commit is in its history.
func (p *pusher) verify(ctx context.Context) Pusher {
	s := Pusher{}
	s.Pushes, s.Failures = p.counts()
	if s.Pushes == 0 {
		s.Note = "nothing was pushed"
		return s
	}
	if r := p.c.run(ctx, p.dir, "", "fetch", "-q", "origin", p.branch); r.Err != nil {
		s.Note = "could not verify: " + r.Err.Error()
		return s
	}
	s.Tip, _ = p.c.output(ctx, p.dir, "rev-parse", "FETCH_HEAD")
	args := []string{"rev-list", "FETCH_HEAD"}
	if p.base != "" {
		args = append(args, "^"+p.base)
	}
	out, err := p.c.output(ctx, p.dir, args...)
	if err != nil {
		s.Note = "could not verify: " + err.Error()
		return s
	}
	onServer := map[string]bool{}
	for _, c := range strings.Split(out, "\n") {
		onServer[c] = true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, push := range p.pushes {
		if push.Result == ResultOK && !onServer[push.Commit] {
			s.Lost = append(s.Lost, push.Commit)
		}
	}
	s.Verified = true
	return s
}
