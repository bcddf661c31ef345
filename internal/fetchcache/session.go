package fetchcache

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
	"time"

	"packwire/internal/gitexec"
)

// A recorded session is one stateful upload-pack conversation (protocol
// v0/v1 over git:// or SSH): the client's input bytes and git's output
// bytes, with, for each piece of output, how much input git had been given
// before it wrote it. git's output after a packet depends only on the
// packets before it, so a follower whose input matches the recorded input
// up to a piece's point may be sent that piece without a git of its own.
// Followers read the output from the file as it grows, or from a stored
// recording, with the same bounds, sightings and files as fetch responses.
//
// A stored recording's file is the output followed by a trailer: the
// input, the pieces, the trailer's length and sessionMagic.

// sessionMagic ends every stored recording's file.
const sessionMagic = "pwsess01"

// MaxSessionInput bounds the input a recording keeps: a v0 fetch's wants
// and haves are a few KiB; a session whose client sent more is not kept
// (its followers run git).
const MaxSessionInput = 1 << 20

// sessionPiece is output up to end (an offset), written once git had been
// given in bytes of input.
type sessionPiece struct {
	end, in int64
}

// sessionLog is a recording's input and pieces, growing while its leader
// runs, fixed once it ended (or read from a stored file).
type sessionLog struct {
	mu      sync.Mutex
	input   []byte
	pieces  []sessionPiece
	out     int64 // output so far
	ended   bool
	ok      bool          // ended with git's success: the recording is whole
	tooBig  bool          // input past MaxSessionInput, or output not written: ends not ok
	changed chan struct{} // closed and replaced on every change
}

// whole tells whether the recording ended with git's success: what it
// holds is final.
func (l *sessionLog) whole() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ended && l.ok
}

func newSessionLog() *sessionLog { return &sessionLog{changed: make(chan struct{})} }

// notifyLocked wakes the followers waiting for a change.
func (l *sessionLog) notifyLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// SessionStep is what a follower may do now (SessionReplay.Step).
type SessionStep struct {
	// SendTo: output up to this offset may be sent.
	SendTo int64
	// Diverged: the follower's input differs from the recording's, or the
	// recording failed where the follower goes on: it needs a git.
	Diverged bool
	// Done: the follower was sent everything git would have sent it, and git
	// would have ended there: the session is over.
	Done bool
	// NeedInput: nothing more can be sent before the follower sends more.
	NeedInput bool
	// Changed is closed when the recording grows (nil: it will not).
	Changed <-chan struct{}
}

func (l *sessionLog) step(input []byte, sent int64) SessionStep {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := SessionStep{SendTo: sent}
	if !l.ended {
		st.Changed = l.changed
	}
	n := min(len(input), len(l.input))
	if !bytes.Equal(input[:n], l.input[:n]) || l.ended && !l.ok {
		st.Diverged = true
		return st
	}
	// The last piece written with no more input than matched.
	i := sort.Search(len(l.pieces), func(i int) bool { return l.pieces[i].in > int64(n) })
	if i > 0 {
		st.SendTo = max(sent, l.pieces[i-1].end)
	}
	switch {
	case i < len(l.pieces):
		st.NeedInput = l.pieces[i].in > int64(len(input))
	case l.ended && len(input) >= len(l.input):
		st.Done = sent >= l.out
	case l.ended:
		st.NeedInput = true // git ended after input this follower has not sent yet
	}
	return st
}

// SessionReplay is a follower's view of one recording: live (its leader
// still runs) or stored. Close it when done.
type SessionReplay struct {
	r   *Reader
	log *sessionLog
	pos int64 // the file's offset, where StreamFile sends from
}

// Step compares input (all the follower sent, from its first byte) with
// the recording and says what may be sent now, sent being what was.
func (s *SessionReplay) Step(input []byte, sent int64) SessionStep {
	return s.log.step(input, sent)
}

// ReadAt reads recorded output.
func (s *SessionReplay) ReadAt(p []byte, off int64) (int, error) { return s.r.ReadAt(p, off) }

// Send writes output [from, to) to out: with the transport's StreamFile
// (sendfile over git://) where it has one, otherwise in chunks. idle > 0
// bounds each write when out can take deadlines.
func (s *SessionReplay) Send(ctx context.Context, out io.Writer, from, to int64, idle time.Duration) (int64, error) {
	if to <= from {
		return 0, nil
	}
	deadliner, _ := out.(gitexec.WriteDeadliner)
	if deadliner != nil {
		defer gitexec.DeadlineOnCancel(ctx, deadliner.SetWriteDeadline)()
	}
	if fs, ok := out.(FileStreamer); ok {
		if s.pos != from {
			if _, err := s.r.f.Seek(from, io.SeekStart); err != nil {
				return 0, err
			}
		}
		n, err := StreamerFor(fs, s.log.whole())(s.r.f, to-from)
		s.pos = from + n
		if err == nil && n < to-from {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return n, wrapGone(ctx, err)
		}
		return n, nil
	}
	s.pos = -1 // the file's offset is no longer known to be from
	return s.r.copy(ctx, out, from, to, deadliner, idle, s.log.whole())
}

// Close releases the replay; the last reader of a recording whose leader
// left stops its git.
func (s *SessionReplay) Close() { s.r.Close() }

// SessionRecorder records the session of a leader: its client's input
// (Input), git's output (Output), and how it ended (Finish).
type SessionRecorder struct {
	c       *Cache
	w       *Writer
	lead    *Reader // the leader's hold on the run, released when its client leaves
	log     *sessionLog
	leftRun sync.Once
}

// NewSessionRecording starts a recording whose key is not known yet (the
// leader's client has not said what it wants): Publish makes it followable
// once it is. With ErrStandAside, record nothing.
func (c *Cache) NewSessionRecording() (*SessionRecorder, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, w, err := c.startLocked("", false, true)
	if err != nil {
		return nil, err
	}
	return w.recorder, nil
}

// JoinSession looks the recording of key up: a stored one or one in
// progress to follow, or none, and then the caller leads: it runs git and
// records the session. Recordings are stored on their second sighting, as
// responses to fetches with haves are (JoinIncremental): most sessions
// are one runner's.
func (c *Cache) JoinSession(key string) (*SessionReplay, *SessionRecorder, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	seenBefore := c.sightedLocked(key, time.Now())
	if path, size, ok := c.storedLocked().Lookup(key); ok {
		if f, err := os.Open(path); err == nil {
			log, err := readSessionTrailer(f, size)
			if err == nil {
				return &SessionReplay{r: &Reader{f: f, size: size}, log: log}, nil, nil
			}
			f.Close()
		}
		c.stored.DropIfPath(key, path) // unreadable: forget it
	}
	if g, ok := c.inflight[key]; ok && g.log != nil {
		if f, err := os.Open(g.path); err == nil {
			g.readers++
			g.joined++
			return &SessionReplay{r: &Reader{f: f, g: g, c: c}, log: g.log}, nil, nil
		}
	}
	_, w, err := c.startLocked(key, !seenBefore, true)
	if err != nil {
		return nil, nil, err
	}
	return nil, w.recorder, nil
}

// Publish makes a recording started by NewSessionRecording followable
// under key. It reports false (the recording goes on, unshared) when key
// has a recording already.
func (r *SessionRecorder) Publish(key string) bool {
	c := r.c
	c.mu.Lock()
	defer c.mu.Unlock()
	seenBefore := c.sightedLocked(key, time.Now())
	if _, _, ok := c.storedLocked().Lookup(key); ok {
		return false
	}
	if _, ok := c.inflight[key]; ok {
		return false
	}
	g := r.w.g
	if g.key != "" || g.readers == 0 {
		return false // published already, or its leader left
	}
	if _, done, _ := g.State(); done {
		return false
	}
	g.key, g.probation = key, !seenBefore
	c.inflight[key] = g
	return true
}

// OnAbandon sets what stops the leader's git once its client and every
// follower have left.
func (r *SessionRecorder) OnAbandon(stop func()) { r.w.OnAbandon(stop) }

// LeaderLeft is the leader's client gone: git goes on while followers
// read, and is stopped (OnAbandon) when the last of them leaves.
func (r *SessionRecorder) LeaderLeft() { r.leftRun.Do(func() { r.lead.Close() }) }

// Input records bytes the leader's client sent, in order.
func (r *SessionRecorder) Input(p []byte) {
	l := r.log
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended || len(p) == 0 {
		return
	}
	if len(l.input)+len(p) > MaxSessionInput {
		// Ended at once, not only marked: output recorded after input
		// that is not would be offered to followers as answering the
		// shorter input.
		l.tooBig = true
		l.ended, l.ok = true, false
		l.notifyLocked()
		return
	}
	l.input = append(l.input, p...)
	l.notifyLocked()
}

// InputLen is how much input was recorded so far.
func (r *SessionRecorder) InputLen() int64 {
	r.log.mu.Lock()
	defer r.log.mu.Unlock()
	return int64(len(r.log.input))
}

// Break ends the recording as failed at once: its followers run git.
func (r *SessionRecorder) Break() {
	l := r.log
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ended, l.ok = true, false
	l.notifyLocked()
}

// Output records git's output p before it goes to the leader's client: a
// follower whose input matches all the leader's client had sent so far
// may be sent it.
func (r *SessionRecorder) Output(p []byte) error {
	return r.OutputAt(p, -1)
}

// OutputAt is Output for output git wrote once it had been given in bytes
// of input (-1: all recorded so far), never more than recorded, and never
// less than for the output before.
func (r *SessionRecorder) OutputAt(p []byte, in int64) error {
	l := r.log
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended || len(p) == 0 {
		return nil
	}
	if in < 0 || in > int64(len(l.input)) {
		in = int64(len(l.input))
	}
	if len(l.pieces) > 0 {
		in = max(in, l.pieces[len(l.pieces)-1].in)
	}
	n, err := r.w.Write(p)
	l.out += int64(n)
	if err != nil {
		l.tooBig = true // the file is short of what was recorded: never kept
	}
	if len(l.pieces) > 0 && l.pieces[len(l.pieces)-1].in == in {
		l.pieces[len(l.pieces)-1].end = l.out
	} else {
		l.pieces = append(l.pieces, sessionPiece{end: l.out, in: in})
	}
	l.notifyLocked()
	return err
}

// Finish ends the recording: ok means git succeeded and everything it
// wrote was recorded; the recording is then stored (bounds and sightings
// permitting). Followers of a recording that did not end ok run git.
func (r *SessionRecorder) Finish(ok bool) {
	l := r.log
	l.mu.Lock()
	ok = ok && !l.tooBig && !l.ended
	var err error
	if ok {
		_, err = r.w.Write(encodeSessionTrailer(l))
	}
	ok = ok && err == nil
	l.ended, l.ok = true, ok
	l.notifyLocked()
	l.mu.Unlock()
	if !ok && err == nil {
		err = errors.New("the recorded session did not complete")
	}
	size := r.w.out.N()
	if cerr := r.w.out.F.Close(); err == nil && cerr != nil {
		err = cerr
	}
	r.c.finish(r.w.g, size, err)
	r.LeaderLeft()
}

// encodeSessionTrailer is the trailer of log's file: input length and
// bytes, output length, the pieces (deltas), its own length, the magic.
func encodeSessionTrailer(l *sessionLog) []byte {
	var b []byte
	b = binary.AppendUvarint(b, uint64(len(l.input)))
	b = append(b, l.input...)
	b = binary.AppendUvarint(b, uint64(l.out))
	b = binary.AppendUvarint(b, uint64(len(l.pieces)))
	var end, in int64
	for _, p := range l.pieces {
		b = binary.AppendUvarint(b, uint64(p.end-end))
		b = binary.AppendUvarint(b, uint64(p.in-in))
		end, in = p.end, p.in
	}
	b = binary.BigEndian.AppendUint64(b, uint64(len(b)))
	return append(b, sessionMagic...)
}

// readSessionTrailer reads the trailer of a stored recording of size bytes.
func readSessionTrailer(f io.ReaderAt, size int64) (*sessionLog, error) {
	if size < 16 {
		return nil, errors.New("recording: too short")
	}
	var tail [16]byte
	if _, err := f.ReadAt(tail[:], size-16); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint64(tail[:8])
	if string(tail[8:]) != sessionMagic || n > uint64(size-16) || n > 2*MaxSessionInput+(64<<20) {
		return nil, errors.New("recording: bad trailer")
	}
	meta := make([]byte, n)
	if _, err := f.ReadAt(meta, size-16-int64(n)); err != nil {
		return nil, err
	}
	log, err := ParseSessionTrailer(meta)
	if err != nil {
		return nil, err
	}
	if log.out != size-16-int64(n) {
		return nil, errors.New("recording: output length does not match the file")
	}
	return log, nil
}

// ParseSessionTrailer decodes a trailer's body (without its length and
// magic) into a finished, whole recording's log. Fuzzed.
func ParseSessionTrailer(b []byte) (*sessionLog, error) {
	bad := func(what string) (*sessionLog, error) { return nil, fmt.Errorf("recording: bad %s", what) }
	next := func() (int64, bool) {
		v, k := binary.Uvarint(b)
		if k <= 0 || v > 1<<62 {
			return 0, false
		}
		b = b[k:]
		return int64(v), true
	}
	inLen, ok := next()
	if !ok || inLen > MaxSessionInput || inLen > int64(len(b)) {
		return bad("input")
	}
	log := newSessionLog()
	log.input = bytes.Clone(b[:inLen])
	b = b[inLen:]
	out, ok1 := next()
	count, ok2 := next()
	if !ok1 || !ok2 || count > int64(len(b))/2 {
		return bad("pieces")
	}
	var end, in int64
	for range count {
		de, ok1 := next()
		di, ok2 := next()
		if !ok1 || !ok2 || de == 0 || di == 0 && len(log.pieces) > 0 || de > out-end || di > inLen-in {
			return bad("piece")
		}
		end, in = end+de, in+di
		log.pieces = append(log.pieces, sessionPiece{end: end, in: in})
	}
	if len(b) != 0 || end != out {
		return bad("end")
	}
	log.out, log.ended, log.ok = out, true, true
	return log, nil
}
