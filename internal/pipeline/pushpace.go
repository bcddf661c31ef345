package pipeline

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// A push is paced like a fetch request, so that a writer who trickles
// cannot hold a push slot: its commands must arrive under the pipeline's
// Pace (the slot is taken only once they are read), and its pack, from
// its first byte (no slot is taken before it comes) to its end, must
// average Pace.MinRate after Pace.Grace. The pack has no bound on its
// whole time: a large pack over a slow link is honest. Before its first
// byte the client may be silent (git counts and compresses objects) for
// the idle timeout, holding no slot.

// pushStream is the client's side of a push: it counts what arrives, for
// the pace, and ends the pack's pace at EOF (over HTTP the body's end is
// the pack's; the server may then take its time).
type pushStream struct {
	r io.Reader
	n atomic.Int64 // bytes since the start of the phase being paced

	mu   sync.Mutex
	eof  bool
	pack *packPace
}

func (s *pushStream) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	s.n.Add(int64(n))
	if err != nil {
		s.mu.Lock()
		s.eof = true
		pack := s.pack
		s.mu.Unlock()
		if pack != nil {
			pack.end()
		}
	}
	return n, err
}

// packPace watches the pack of a push from its first byte until end is
// called: at the client's EOF, at receive-pack's first output (its
// keepalives and report come once the pack is in), or when the push ends.
// A client without side-band that keeps its side open gets no output
// before the report: its pace runs on while receive-pack checks the pack,
// which a pack of n bytes has grace + n/MinRate for (packwire does not
// parse the pack to find its end).
type packPace struct {
	pace  Pace
	start time.Time
	n     *atomic.Int64
	stop  func() bool
	once  sync.Once
	fired atomic.Bool
}

// pacePack starts the pack's pace. buffered is what was read of the pack
// already (the commands' reader reads ahead).
func (s *pushStream) pacePack(pace Pace, buffered int, cancel context.CancelCauseFunc) *packPace {
	pace.Max = 0
	pp := &packPace{pace: pace, start: time.Now(), n: &s.n}
	s.n.Store(int64(buffered))
	pp.stop = paceWatch(pace, pp.start, &s.n, cancel)
	s.mu.Lock()
	s.pack = pp
	eof := s.eof
	s.mu.Unlock()
	if eof {
		pp.end()
	}
	return pp
}

// end stops the watch; later calls do nothing.
func (pp *packPace) end() {
	pp.once.Do(func() {
		if pp.stop() {
			pp.fired.Store(true)
		}
	})
}

// cutOff ends the watch and reports whether the pack fell behind.
func (pp *packPace) cutOff() bool {
	if pp == nil {
		return false
	}
	pp.end()
	return pp.fired.Load()
}

// slowError is the refusal of a pack that fell behind.
func (pp *packPace) slowError() *Error {
	msg := fmt.Sprintf("push too slow: %d bytes of pack in %s (a push must average %d bytes/s after %s)",
		pp.n.Load(), time.Since(pp.start).Round(time.Second), pp.pace.MinRate, pp.pace.Grace)
	return &Error{Code: CodeTimeout, Message: msg, Err: ErrTooSlow}
}

// endOnWrite ends the pack's pace at receive-pack's first output.
type endOnWrite struct {
	w    io.Writer
	pack *packPace
}

func (e endOnWrite) Write(p []byte) (int, error) {
	e.pack.end()
	if e.pack.fired.Load() {
		// Cut off: what receive-pack says of its stdin's end (early EOF)
		// must not reach the client before the refusal.
		return 0, ErrTooSlow
	}
	return e.w.Write(p)
}
