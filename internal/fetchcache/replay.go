package fetchcache

import (
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"time"

	"packwire/internal/gitexec"
)

// FileServer is implemented by response writers that can send a whole
// file as the response body themselves, with the fewest copies (the HTTP
// transport: Content-Length, then sendfile). Replay uses it when the whole
// response is on disk and nothing was written yet. It returns the bytes
// sent.
type FileServer interface {
	ServeFile(f *os.File, size int64) (int64, error)
}

// FileStreamer is implemented by response writers that can send a file's
// bytes themselves as they become available (the HTTP transport, over
// HTTP/1.1: no chunking, sendfile). StreamFile sends the next n bytes of f
// from its current offset and returns how many it sent. Replay uses it for
// a run in progress when nothing was written yet.
type FileStreamer interface {
	StreamFile(f *os.File, n int64) (int64, error)
}

// DoneStreamer is implemented by response writers that send the end of an
// output known to be final (the rest of a response whose run ended, a
// stretch of a recording that ended) otherwise than output still being
// written: the SSH transport sends a small one unpaced. StreamDone is
// StreamFile for such a stretch; Replay and SessionReplay.Send use it
// instead of StreamFile when they may.
type DoneStreamer interface {
	StreamDone(f *os.File, n int64) (int64, error)
}

// StreamerFor is fs's way to send a stretch: StreamDone where it has one
// and the stretch is final, else StreamFile.
func StreamerFor(fs FileStreamer, final bool) func(*os.File, int64) (int64, error) {
	if ds, ok := fs.(DoneStreamer); ok && final {
		return ds.StreamDone
	}
	return fs.StreamFile
}

// HoldBack is how much of a run's output a follower waits for before it
// sends anything (unless the run ends first). Before the pack flows, git
// sends only section headers and progress; a run that fails then (while
// counting or compressing: killed, out of memory) leaves followers that
// have sent nothing, free to run git themselves instead of failing too.
const HoldBack = 64 << 10

// Reader replays one response: a stored one, or a run in progress that it
// follows as the file grows. Close it when done.
type Reader struct {
	f    *os.File
	size int64       // a stored response: its size
	g    *generation // a run in progress (nil for a stored response)
	c    *Cache
	// leads: this reader's request runs git, so a failed run is passed on
	// as far as it got, as git's own output would be; a follower that has
	// sent nothing yet gets the error instead and may run git itself.
	leads bool
	// streamed: the response goes out through FileStreamer from the
	// file's own offset, which then always equals what was written.
	streamed bool
	once     sync.Once
}

// ReadAt reads the response at off, as far as it is written.
func (r *Reader) ReadAt(p []byte, off int64) (int, error) { return r.f.ReadAt(p, off) }

// Following tells whether the reader follows a run in progress.
func (r *Reader) Following() bool { return r.g != nil }

// Replay writes the response to out until its end and returns how many
// bytes it wrote. A failed write returns an error wrapping
// gitexec.ErrClientGone, as the relay's does;
// a run that failed returns one wrapping ErrGenerationFailed (with
// written 0 the caller may still run git itself). Cancelling ctx stops
// only this reader. idle > 0 bounds how long one write may block, when out
// is a gitexec.WriteDeadliner.
func (r *Reader) Replay(ctx context.Context, out io.Writer, idle time.Duration) (written int64, err error) {
	deadliner, _ := out.(gitexec.WriteDeadliner)
	if deadliner != nil {
		// A kill (shutdown) unblocks a write stuck on a client that stopped reading.
		defer gitexec.DeadlineOnCancel(ctx, deadliner.SetWriteDeadline)()
	}
	if r.g == nil {
		return r.copy(ctx, out, 0, r.size, deadliner, idle, true)
	}
	for {
		need := written + 1
		if written == 0 && !r.leads {
			need = HoldBack
		}
		size, done, genErr := r.g.Wait(ctx, need)
		if ctx.Err() != nil {
			return written, ctx.Err()
		}
		if done && genErr != nil && written == 0 && !r.leads {
			return 0, genErr
		}
		// Once the run ended well, what is left to send is all there is.
		n, err := r.copy(ctx, out, written, size, deadliner, idle, done && genErr == nil)
		written += n
		if err != nil {
			return written, err
		}
		if done {
			return written, genErr
		}
	}
}

// copy sends [off, end) of the file to out: whole with ServeFile when that
// is the entire response and nothing went out yet, else in chunks.
func (r *Reader) copy(ctx context.Context, out io.Writer, off, end int64, d gitexec.WriteDeadliner, idle time.Duration, final bool) (int64, error) {
	if end <= off {
		// Nothing to send: a transport's StreamFile would start its
		// response (HTTP 200) with nothing in it, and a run that failed
		// before writing a byte must leave the transport free to say so.
		return 0, nil
	}
	if off == 0 && end > 0 && r.complete(end) {
		if fs, ok := out.(FileServer); ok {
			n, err := fs.ServeFile(r.f, end)
			if err != nil {
				return n, wrapGone(ctx, err)
			}
			return n, nil
		}
	}
	if fs, ok := out.(FileStreamer); ok && (off == 0 || r.streamed) {
		r.streamed = true
		n, err := StreamerFor(fs, final)(r.f, end-off)
		if err == nil && n < end-off {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return n, wrapGone(ctx, err)
		}
		return n, nil
	}
	bufp := gitexec.CopyBuffers.Get().(*[]byte)
	defer gitexec.CopyBuffers.Put(bufp)
	buf := *bufp
	var written int64
	for off < end {
		n, rerr := r.f.ReadAt(buf[:min(int64(len(buf)), end-off)], off)
		if n > 0 {
			if d != nil && idle > 0 {
				d.SetWriteDeadline(time.Now().Add(idle))
			}
			if _, err := out.Write(buf[:n]); err != nil {
				return written, wrapGone(ctx, err)
			}
			off += int64(n)
			written += int64(n)
		}
		if rerr != nil && rerr != io.EOF {
			return written, rerr
		}
		if rerr == io.EOF && n == 0 {
			return written, io.ErrUnexpectedEOF // the file is shorter than it said
		}
	}
	return written, nil
}

// complete tells whether end is the end of the whole, successful response.
func (r *Reader) complete(end int64) bool {
	if r.g == nil {
		return end == r.size
	}
	size, done, err := r.g.State()
	return done && err == nil && end == size
}

func wrapGone(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return errors.Join(gitexec.ErrClientGone, err)
}

// Close releases the reader; the last reader of an unfinished run stops it.
func (r *Reader) Close() error {
	r.once.Do(func() {
		r.f.Close()
		if r.g != nil {
			r.c.leave(r.g)
		}
	})
	return nil
}
