// Package growfile is the state of a file that one producer writes while
// readers follow it: how much it holds so far, whether it ended and how,
// and a way to wait for more. The fetch cache and the pack cache share one
// git run between many clients through it: git's output goes to a file,
// and every client reads that file as it grows, at its own pace.
package growfile

import (
	"context"
	"os"
	"sync"
	"time"
)

// Growth is one file's progress. Its zero value is not usable; call New.
type Growth struct {
	mu    sync.Mutex
	cond  *sync.Cond // signalled on growth and at the end
	size  int64      // bytes written so far
	woken int64      // size when readers were last woken
	done  bool       // the producer finished (successfully or not)
	err   error      // why it failed, if it did
}

// New returns the progress of an empty file.
func New() *Growth {
	g := &Growth{}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// Grew records that the file now holds size bytes (a size never goes
// back) and wakes its readers.
func (g *Growth) Grew(size int64) { g.grow(size, false) }

// wakeEvery batches the Writer's wake-ups of readers while a large output
// streams: waking them for every pipe read (64 KiB) cost more CPU in
// goroutine hand-offs than the copying itself (measured on the fetch
// cache's first design). Small writes (a pack's header, the end of a
// response) wake them at once, and so does the end of the run.
const (
	wakeEvery  = 1 << 20
	smallWrite = 4 << 10
)

func (g *Growth) grow(size int64, batch bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if size <= g.size {
		return
	}
	small := size-g.size < smallWrite
	g.size = size
	if !batch || small || g.size-g.woken >= wakeEvery {
		g.woken = g.size
		g.cond.Broadcast()
	}
}

// End records that the producer finished with the file at size bytes; err
// nil means the file holds the whole output. Every reader is woken.
func (g *Growth) End(size int64, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.size, g.done, g.err = size, true, err
	g.cond.Broadcast()
}

// State returns the size so far, whether the run ended, and how.
func (g *Growth) State() (size int64, done bool, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.size, g.done, g.err
}

// Wait blocks until the file holds need bytes, the run ended, or ctx is
// done, and returns the state then.
func (g *Growth) Wait(ctx context.Context, need int64) (size int64, done bool, err error) {
	g.mu.Lock()
	if g.size >= need || g.done {
		// A reader catching up does not wait: no cancellation hook to set.
		defer g.mu.Unlock()
		return g.size, g.done, g.err
	}
	g.mu.Unlock()
	stop := context.AfterFunc(ctx, func() {
		g.mu.Lock()
		g.cond.Broadcast()
		g.mu.Unlock()
	})
	defer stop()
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.size < need && !g.done && ctx.Err() == nil {
		g.cond.Wait()
	}
	return g.size, g.done, g.err
}

// Writer appends to a file and records its growth: the producer's side,
// for output that passes through Go (a command's Stdout). It wakes
// readers in batches (see wakeEvery).
type Writer struct {
	F *os.File
	G *Growth
	n int64
}

func (w *Writer) Write(p []byte) (int, error) {
	n, err := w.F.Write(p)
	w.n += int64(n)
	w.G.grow(w.n, true)
	return n, err
}

// N is how many bytes were written through w.
func (w *Writer) N() int64 { return w.n }

// Watch records the growth of f, which a producer writes itself (git's
// stdout is the file: no copy through packwire), by looking at its size
// every so often; a stat costs a microsecond, and readers see new bytes at
// most one interval (every) after they were written. stop ends the watching and returns once it has.
func Watch(f *os.File, g *Growth, every time.Duration) (stop func()) {
	quit, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				if fi, err := f.Stat(); err == nil {
					g.Grew(fi.Size())
				}
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(quit) })
		<-finished
	}
}
