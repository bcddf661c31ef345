package ssh

import (
	"reflect"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	gossh "golang.org/x/crypto/ssh"
)

// DefaultMaxUnacked is how many bytes of a session's output the client's
// ssh may hold that git has not read yet, by packwire's estimate; see
// pacedWriter.
const DefaultMaxUnacked = 512 << 10

// unpacedMax is the largest response sent unpaced when its size is known
// beforehand (see pacedWriter): twice OpenSSH's 2 MiB window.
const unpacedMax = 4 << 20

// pacedWriter writes git's output to a session channel so that the client's
// ssh holds at most about limit bytes that git has not read yet, whatever
// window the client offers (OpenSSH: 2 MiB).
//
// Why: OpenSSH's client keeps what git has not read yet in one buffer that
// grows 32 KiB at a time, and past glibc's mmap threshold each growth is a
// new mapping, a copy of everything buffered, a zeroing of the old buffer
// and an munmap. Filling the whole window while git's index-pack drains
// slower made the client's ssh map, copy and zero ~10x the pack (strace: 145
// remaps of up to 1 MB for a 30 MB pack) and tripled its CPU.
//
// What the client has not acknowledged (its window adjusts follow git's
// reads) is its buffer plus what is on the way there and back: about
// rate x RTT. So the allowance is limit + 2 x (acknowledged bytes per
// second, its recent peak) x (round-trip time): on loopback that is limit; on a long path
// whose throughput the network, not git, bounds it grows by 3x per round
// trip until the client's whole window is in use, as without pacing. Until
// a round trip (keepalive@openssh.com, answered in order behind the data)
// and then the rate over one round trip (at least 10 ms) have been
// measured, nothing is paced: a far client's first round trip is never
// held back, and a near one's buffer fills once at most. The round trip is
// measured at the start of each command, before git's output flows: once
// the client's buffer has filled to its window, the client's CPU stays
// high for the rest of a large pack (30 MB: 0.18-0.24 s with the probe
// sent after the first 64 KiB, or with the first 1-4 MiB unpaced, against
// 0.07-0.13 s).
//
// Pacing costs the server a wake-up per window adjust that arrives while
// the writer waits (the read loop, the mux hand-off, the broadcast, the
// runtime's sysmon): a repeated clone of a 3 MiB repository cost 14-20 ms
// of server CPU paced against 8-10 ms unpaced. So output whose size is
// known beforehand and at most unpacedMax is sent unpaced: a fetch cache
// replay through channelWriter.ServeFile, and a final stretch of at most
// unpacedMax through StreamDone (the end of a followed response, or of a
// recorded v0 session); the client's buffer then fills once, to its
// window at most.
//
// The writer never waits for a window adjust that the client's own rule
// sends only after more data. Clients return window by different rules:
// OpenSSH and x/crypto/ssh as soon as more than three packets (96 KiB) are
// unreturned and git has read any of it (adjustFloor covers that); libssh2
// (libgit2) only once its application reads with over a quarter of its
// 2 MiB window unreturned, and jsch (JGit) once over half its 1 MiB window
// is, each returning all of it at once. A client's returns of such a rule
// are each larger than what it lets stay unreturned, so the writer waits
// only while more is unacknowledged than the smallest return the client has
// made (see waitRoom), and not at all before its first: with libssh2 and
// jsch it runs on each ~0.5 MiB return, with OpenSSH as before. As a last
// resort for a rule none of these follows, a writer that has waited
// stallWait with no return at all stops pacing that channel.
//
// x/crypto/ssh exposes no window, so channelWindow reads the channel's own
// (under its lock, as the library does). Where its layout is not the one
// expected, pacing is off and writes go straight to the channel.
type pacedWriter struct {
	gossh.Channel
	window *channelWindow // nil: not paced
	limit  uint32
}

func newPacedWriter(ch gossh.Channel, limit int) pacedWriter {
	w := pacedWriter{Channel: ch}
	if limit > 0 {
		w.window = windowOf(ch)
		w.limit = uint32(min(max(limit, minLimit), 1<<30))
	}
	return w
}

// setRTT records a measured round trip; the smallest one counts.
func (w pacedWriter) setRTT(rtt time.Duration) {
	if w.window == nil || rtt <= 0 {
		return
	}
	for {
		old := w.window.rtt.Load()
		if old != 0 && old <= int64(rtt) || w.window.rtt.CompareAndSwap(old, int64(rtt)) {
			return
		}
	}
}

// adjustFloor is what the writer must always be free to leave
// unacknowledged: OpenSSH's client sends a window adjust only once more
// than three packets (96 KiB) are, so a writer that waited below that
// would wait forever.
const adjustFloor = 128 << 10

// minLimit is the smallest limit honoured: below it the writer would wait
// with no more than adjustFloor unacknowledged (--ssh-max-unacked 64K
// stalled every OpenSSH client); smaller limits are raised to it.
const minLimit = 2 * adjustFloor

// piece is how much Write sends at a time: half the limit, so that the
// writer runs once the client has acknowledged half of what it may hold
// rather than after every window adjust (OpenSSH sends one per ~40 KiB
// read; each run costs a wake-up of another thread and of the Go
// runtime's monitor). The writer waits while more than limit - piece is
// unacknowledged, so that must stay at least adjustFloor; below a limit of
// 256 KiB pieces are a quarter of it, as they always were.
func (w pacedWriter) piece() uint32 {
	return max(min(w.limit/2, max(w.limit/4, w.limit-min(w.limit, adjustFloor))), 1)
}

// Write sends p in pieces (see piece), each once the allowance leaves
// room for it.
func (w pacedWriter) Write(p []byte) (int, error) {
	if w.window == nil {
		return w.Channel.Write(p)
	}
	piece := w.piece()
	n := 0
	for len(p) > 0 {
		size := min(uint32(len(p)), piece)
		w.window.waitRoom(size, w.limit)
		m, err := w.Channel.Write(p[:size])
		w.window.wrote(m)
		n += m
		if err != nil {
			return n, err
		}
		p = p[size:]
	}
	return n, nil
}

// stalled reports whether pacing stopped for want of a window adjust (see
// stallWait).
func (w pacedWriter) stalled() bool {
	if w.window == nil {
		return false
	}
	w.window.cond.L.Lock()
	defer w.window.cond.L.Unlock()
	return w.window.stalled
}

// writeUnpaced sends p as the client's window allows, counted as sent.
func (w pacedWriter) writeUnpaced(p []byte) (int, error) {
	n, err := w.Channel.Write(p)
	if w.window != nil {
		w.window.wrote(n)
	}
	return n, err
}

// rateInterval is the shortest interval the acknowledgement rate is
// measured over.
const rateInterval = 10 * time.Millisecond

// channelWindow is x/crypto/ssh's remote window of one channel: win is the
// room the client has granted, guarded by cond.L; add (a window adjust)
// and close broadcast on cond. The other fields are packwire's, also under
// cond.L (rtt excepted).
type channelWindow struct {
	cond   *sync.Cond
	win    *uint32
	closed *bool

	max       uint32       // the largest window seen: the client's whole window
	sent      uint64       // bytes written through the pacedWriter
	rtt       atomic.Int64 // smallest measured round trip (ns); 0: none yet
	rate      float64      // acknowledged bytes per second: recent peak
	rated     bool         // rate has been measured once
	rateSince time.Time
	ackedThen uint64

	ackedSeen uint64      // acknowledged bytes at the last look
	minReturn uint32      // the smallest window the client returned at once, as seen; 0: none yet
	stalled   bool        // the writer waited stallWait with no return: not paced any more
	stall     *time.Timer // sets stalled while the writer waits; nil until it first does
}

// stallWait is how long a writer waits with no window returned before it
// stops pacing its channel: a client that returns nothing then is either
// one whose rule wants more data first (none of OpenSSH, libssh2, jsch,
// x/crypto/ssh, paramiko) or one whose git has not read for that long, for
// which pacing saves nothing.
const stallWait = time.Second

func (w *channelWindow) wrote(n int) {
	w.cond.L.Lock()
	w.sent += uint64(n)
	w.cond.L.Unlock()
}

// unacked is what the client has not acknowledged: its whole window less
// what it grants now. Call with cond.L held.
func (w *channelWindow) unacked() uint32 {
	win := *w.win
	if win > w.max {
		w.max = win // the client grew its window
	}
	return w.max - win
}

// allowance is how many unacknowledged bytes are allowed now. Call with
// cond.L held.
func (w *channelWindow) allowance(limit uint32, now time.Time) uint32 {
	rtt := time.Duration(w.rtt.Load())
	if rtt == 0 {
		return w.max // no round trip measured: not paced
	}
	acked := w.sent - min(uint64(w.unacked()), w.sent) // stderr shares the window
	if w.rateSince.IsZero() {
		w.rateSince, w.ackedThen = now, acked
		return w.max // no rate yet: a far client's first round trip is not held back
	}
	if d := now.Sub(w.rateSince); d >= max(rateInterval, rtt) {
		// The peak, fading by a fifth per interval: a moment in which
		// git reads slower must not shrink a far client's allowance.
		w.rate = max(float64(acked-w.ackedThen)/d.Seconds(), w.rate*0.8)
		w.rateSince, w.ackedThen = now, acked
		w.rated = true
	}
	if !w.rated {
		return w.max
	}
	inFlight := 2 * w.rate * rtt.Seconds()
	if float64(limit)+inFlight >= float64(w.max) {
		return w.max
	}
	return limit + uint32(inFlight)
}

// waitRoom blocks until size more bytes stay within the allowance, or
// nothing is unacknowledged, or the channel closed. It never waits with no
// more unacknowledged than the smallest window the client has returned at
// once (nor before its first return): a client that returns window only
// past some amount returns more than that amount each time, and so would
// never send the adjust waited for (see pacedWriter).
func (w *channelWindow) waitRoom(size, limit uint32) {
	w.cond.L.Lock()
	defer w.cond.L.Unlock()
	waited := false
	for {
		unacked := w.unacked()
		returned := w.sawReturns(unacked)
		if *w.closed || w.stalled || unacked == 0 || w.minReturn == 0 || unacked <= w.minReturn ||
			unacked+size <= w.allowance(limit, time.Now()) {
			if waited {
				w.stall.Stop()
			}
			return
		}
		// Wait; the stall timer runs from the last return seen.
		if w.stall == nil {
			w.stall = time.AfterFunc(stallWait, w.stallFired)
		} else if !waited || returned {
			w.stall.Reset(stallWait)
		}
		waited = true
		w.cond.Wait()
	}
}

// sawReturns notes the window the client returned since the last look and
// reports whether it returned any. Several adjusts seen at once count as
// one larger return, which only makes the writer wait less. Call with
// cond.L held.
func (w *channelWindow) sawReturns(unacked uint32) bool {
	acked := w.sent - min(uint64(unacked), w.sent) // as in allowance
	if acked <= w.ackedSeen {
		w.ackedSeen = acked
		return false
	}
	ret := uint32(min(acked-w.ackedSeen, 1<<31))
	if w.minReturn == 0 || ret < w.minReturn {
		w.minReturn = ret
	}
	w.ackedSeen = acked
	return true
}

// stallFired stops pacing once the writer has waited stallWait with no
// window returned, and wakes it.
func (w *channelWindow) stallFired() {
	w.cond.L.Lock()
	w.stalled = true
	w.cond.Broadcast()
	w.cond.L.Unlock()
}

// windowOf finds the remote window inside x/crypto/ssh's channel type
// (v0.58: channel.remoteWin, a window{*sync.Cond; win uint32; ...; closed
// bool}), checking every name and type on the way; nil when anything
// differs.
func windowOf(ch gossh.Channel) *channelWindow {
	v := reflect.ValueOf(ch)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return nil
	}
	chv := v.Elem()
	if t := chv.Type(); t.Kind() != reflect.Struct || t.PkgPath() != "golang.org/x/crypto/ssh" || t.Name() != "channel" {
		return nil
	}
	rw := chv.FieldByName("remoteWin")
	if !rw.IsValid() || rw.Kind() != reflect.Struct || rw.Type().Name() != "window" || !rw.CanAddr() {
		return nil
	}
	field := func(name string, typ reflect.Type) unsafe.Pointer {
		f, ok := rw.Type().FieldByName(name)
		if !ok || f.Type != typ || len(f.Index) != 1 {
			return nil
		}
		return unsafe.Add(unsafe.Pointer(rw.UnsafeAddr()), f.Offset)
	}
	condp := field("Cond", reflect.TypeFor[*sync.Cond]())
	winp := field("win", reflect.TypeFor[uint32]())
	closedp := field("closed", reflect.TypeFor[bool]())
	if condp == nil || winp == nil || closedp == nil {
		return nil
	}
	w := &channelWindow{cond: *(**sync.Cond)(condp), win: (*uint32)(winp), closed: (*bool)(closedp)}
	if w.cond == nil {
		return nil
	}
	w.cond.L.Lock()
	w.max = *w.win // the client's initial window: nothing is sent yet
	w.cond.L.Unlock()
	return w
}
