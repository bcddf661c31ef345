package ssh

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"packwire/internal/gittest"
)

// countingConn counts the bytes the client's SSH layer has read off the
// socket.
type countingConn struct {
	net.Conn
	read atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

// bigRepo is 24 MiB of random blobs: a pack far larger than any window.
func bigRepo(t *testing.T, h *harness, name string) {
	t.Helper()
	r, err := h.data.Repos.Create(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	h.env.Git(r.Path, "config", "core.bigFileThreshold", "512k")
	h.env.Git(r.Path, "config", "core.compression", "0")
	h.env.Build(r.Path, gittest.Shape{Commits: 1, Files: 24, BlobBytes: 1 << 20, Incompress: true})
}

// slowClone fetches the whole big pack with the Go client, reading it
// slower than the server sends, and returns the most the client ever held
// that its application had not read yet (bytes off the socket less bytes
// read from the session, less SSH framing), from the 4th MiB on, and the
// pack bytes.
func slowClone(t *testing.T, h *harness, repo string) (held, received int64) {
	t.Helper()
	var conn *countingConn
	client := h.dialAlice(func(nc net.Conn) net.Conn { conn = &countingConn{Conn: nc}; return conn })
	start := conn.read.Load() // the handshake; then only this session's output
	sess, stdin, stdout := h.execUploadPack(client, "/"+repo)
	startUploadPack(t, stdin, stdout) // 1 MiB read, and the advertisement (< 1 KiB)
	received = 1 << 20
	buf := make([]byte, 32<<10)
	for {
		// About 16 MiB/s: slower than git over loopback, as index-pack is.
		time.Sleep(2 * time.Millisecond)
		n, err := io.ReadFull(stdout, buf)
		received += int64(n)
		// SSH framing: under 64 bytes per 32 KiB packet. The first round
		// trip and rate interval are not paced (a far client's first round
		// trip is not held back): count from the 4th MiB on.
		if received >= 4<<20 {
			held = max(held, conn.read.Load()-start-received-received/512)
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			t.Fatalf("reading the pack: %v", err)
		}
	}
	if err := sess.Wait(); err != nil {
		t.Fatalf("clone: %v (read %d bytes)", err, received)
	}
	return held, received
}

// TestPacingBoundsClientBuffer: with MaxUnacked set, a client that reads
// slower than git writes never holds much more than that unread, and still
// gets the whole pack; with pacing off the same client holds ~ its whole
// window (x/crypto/ssh: 2 MiB), which shows the measurement would see a
// missing cap.
func TestPacingBoundsClientBuffer(t *testing.T) {
	t.Parallel()
	const limit = 256 << 10
	for _, tc := range []struct {
		name       string
		maxUnacked int
	}{{"paced", limit}, {"unpaced", -1}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(s *Server) { s.MaxUnacked = tc.maxUnacked })
			bigRepo(t, h, "team/big")
			held, received := slowClone(t, h, "team/big.git")
			t.Logf("client held at most %d KiB unread; pack %d MiB", held>>10, received>>20)
			// A client starved of CPU for a second (a loaded machine) returns
			// no window meanwhile, and pacing then stops for that command by
			// design (stallWait): the cap is not measured then; once more.
			for try := 1; tc.maxUnacked > 0 && held > limit+64<<10 && try < 3 &&
				strings.Count(h.logs.String(), "output pacing stopped") == try; try++ {
				held, received = slowClone(t, h, "team/big.git")
				t.Logf("again: client held at most %d KiB unread; pack %d MiB", held>>10, received>>20)
			}
			if received < 24<<20 {
				t.Fatalf("received %d bytes, want the whole 24 MiB pack", received)
			}
			switch {
			case tc.maxUnacked > 0 && held > limit+64<<10:
				t.Fatalf("client held %d KiB unread, want at most the %d KiB cap (+ framing and a round trip)", held>>10, limit>>10)
			case tc.maxUnacked < 0 && held < 1<<20:
				t.Fatalf("unpaced client held only %d KiB unread: the measurement cannot tell a missing cap", held>>10)
			}
		})
	}
}

// TestPacedCloneWithOpenSSH: a large clone through the OpenSSH client and
// git, paced at a small cap, is complete (fsck), keepalives run, and
// pacing stays on.
func TestPacedCloneWithOpenSSH(t *testing.T) {
	t.Parallel()
	// 64 KiB is below what OpenSSH lets stay unacknowledged before it
	// adjusts its window: it is raised (minLimit) rather than stalling.
	for _, limit := range []int{64 << 10, 128 << 10} {
		h := newHarness(t, func(s *Server) { s.MaxUnacked = limit; s.KeepAlive = 100 * time.Millisecond })
		bigRepo(t, h, "team/big")
		dir := filepath.Join(t.TempDir(), "big")
		h.mustGit("", h.aliceKey, "clone", "--no-checkout", h.url("team/big.git"), dir)
		h.env.Fsck(dir)
		// OpenSSH returns window as git reads: the writer never waits for
		// long enough to give pacing up.
		if logs := h.logs.String(); strings.Contains(logs, "output pacing stopped") {
			t.Fatalf("pacing stopped for OpenSSH:\n%s", logs)
		}
	}
}

// fakeWindow is a channelWindow over a window of its own.
func fakeWindow(win uint32) (*channelWindow, *uint32) {
	w, closed := win, false
	return &channelWindow{cond: sync.NewCond(&sync.Mutex{}), win: &w, closed: &closed, max: win}, &w
}

// TestAllowance: unpaced until a round trip and a rate are known; the cap
// on a short path; the whole window once throughput x RTT needs it.
func TestAllowance(t *testing.T) {
	const window, limit = 2 << 20, 512 << 10
	now := time.Now()
	w, win := fakeWindow(window)
	if got := w.allowance(limit, now); got != window {
		t.Fatalf("no RTT yet: allowance %d, want the whole window", got)
	}
	w.rtt.Store(int64(100 * time.Microsecond)) // loopback
	if got := w.allowance(limit, now); got != window {
		t.Fatalf("no rate yet: allowance %d, want the whole window", got)
	}
	if got := w.allowance(limit, now.Add(time.Millisecond)); got != window {
		t.Fatalf("rate interval not over: allowance %d, want the whole window", got)
	}
	w.sent, *win = 3<<20, window-(1<<20) // 2 MiB acknowledged in 100 ms: 20 MiB/s
	if got := w.allowance(limit, now.Add(100*time.Millisecond)); got < limit || got > limit+8<<10 {
		t.Fatalf("loopback at 20 MiB/s: allowance %d, want about %d", got, limit)
	}
	w.rtt.Store(int64(100 * time.Millisecond)) // far away at 20 MiB/s: 2 MiB on the way
	if got := w.allowance(limit, now.Add(100*time.Millisecond)); got != window {
		t.Fatalf("100 ms RTT at 20 MiB/s: allowance %d, want the whole window", got)
	}
	w.setRTTForTest(50 * time.Millisecond)
	if got := time.Duration(w.rtt.Load()); got != 50*time.Millisecond {
		t.Fatalf("rtt %v after a smaller sample", got)
	}
	w.setRTTForTest(80 * time.Millisecond)
	if got := time.Duration(w.rtt.Load()); got != 50*time.Millisecond {
		t.Fatalf("rtt %v: the smallest sample should count", got)
	}
}

func (w *channelWindow) setRTTForTest(d time.Duration) { pacedWriter{window: w}.setRTT(d) }

// TestWindowOfFindsTheChannelWindow guards the x/crypto/ssh layout pacing
// depends on: after an upgrade that moves it, this fails (and packwire
// logs that pacing is off).
func TestWindowOfFindsTheChannelWindow(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	client := h.dial(h.signer(h.aliceKey))
	defer client.Close()
	ch, reqs, err := client.OpenChannel("session", nil)
	if err != nil {
		t.Fatal(err)
	}
	go gossh.DiscardRequests(reqs)
	defer ch.Close()
	w := windowOf(ch)
	if w == nil {
		t.Fatal("windowOf found no window in x/crypto/ssh's channel")
	}
	if w.max < 64<<10 {
		t.Fatalf("window %d: the server's initial window should be there", w.max)
	}
	if windowOf(struct{ gossh.Channel }{ch}) != nil {
		t.Fatal("windowOf accepted a type that is not x/crypto/ssh's channel")
	}
}

// recordingChannel is a session channel whose writes are recorded and
// counted against a fakeWindow, as x/crypto/ssh's channel does.
type recordingChannel struct {
	gossh.Channel
	w      *channelWindow
	mu     sync.Mutex
	writes []int
}

func (c *recordingChannel) Write(p []byte) (int, error) {
	c.w.cond.L.Lock()
	*c.w.win -= uint32(len(p))
	c.w.cond.L.Unlock()
	c.mu.Lock()
	c.writes = append(c.writes, len(p))
	c.mu.Unlock()
	return len(p), nil
}

func (c *recordingChannel) written() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.writes...)
}

// TestPacedWriterRunsPerHalfLimit: paced output goes out in pieces of half
// the limit, each once the client has acknowledged that much (not after
// every window adjust), and never more than the limit unacknowledged.
func TestPacedWriterRunsPerHalfLimit(t *testing.T) {
	const window, limit = 2 << 20, 512 << 10
	w, win := fakeWindow(window)
	w.rtt.Store(1)                                         // a round trip measured: paced
	w.rated, w.rateSince = true, time.Now().Add(time.Hour) // rate 0, kept: allowance = limit
	w.minReturn = 40 << 10                                 // the client returns window as OpenSSH does
	ch := &recordingChannel{w: w}
	pw := pacedWriter{Channel: ch, window: w, limit: limit}

	done := make(chan error, 1)
	go func() {
		_, err := pw.Write(make([]byte, 2*limit))
		done <- err
	}()
	ack := func(n uint32) {
		w.cond.L.Lock()
		*win += n
		w.cond.L.Unlock()
		w.cond.Broadcast()
	}
	waitWrites := func(n int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for len(ch.written()) < n {
			if time.Now().After(deadline) {
				t.Fatalf("writes %v, want %d", ch.written(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitWrites(2) // the limit, in two pieces
	// A quarter of the limit acknowledged leaves room for a quarter: the
	// writer waits for half.
	ack(limit / 4)
	time.Sleep(50 * time.Millisecond)
	if got := ch.written(); len(got) != 2 {
		t.Fatalf("after a quarter of the limit acknowledged: writes %v, want still 2", got)
	}
	ack(limit / 4)
	waitWrites(3)
	ack(limit / 2)
	waitWrites(4)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, n := range ch.written() {
		if n != limit/2 {
			t.Fatalf("writes %v, want pieces of %d", ch.written(), limit/2)
		}
	}
	w.cond.L.Lock()
	defer w.cond.L.Unlock()
	if unacked := w.unacked(); unacked > limit {
		t.Fatalf("%d bytes unacknowledged, want at most %d", unacked, limit)
	}
}

// TestPacedWriterPiece: half the limit, unless the writer would then wait
// while less than adjustFloor is unacknowledged (OpenSSH would never send
// the window adjust it waits for: TestPacedCloneWithOpenSSH hung so).
func TestPacedWriterPiece(t *testing.T) {
	for _, tc := range []struct{ limit, piece uint32 }{
		{512 << 10, 256 << 10},
		{256 << 10, 128 << 10},
		{192 << 10, 64 << 10},
		{128 << 10, 32 << 10},
		{4, 1},
		{1, 1},
	} {
		if got := (pacedWriter{limit: tc.limit}).piece(); got != tc.piece {
			t.Errorf("limit %d: piece %d, want %d", tc.limit, got, tc.piece)
		}
	}
}

// TestServeFileUnpacedUpToMax: a response of known size up to unpacedMax
// (a fetch cache replay) goes out without waiting for the client, even
// where the allowance is the limit; a larger one is paced.
func TestServeFileUnpacedUpToMax(t *testing.T) {
	const window, limit = 2 << 20, 512 << 10
	w, win := fakeWindow(window)
	w.rtt.Store(1)                                         // a round trip measured
	w.rated, w.rateSince = true, time.Now().Add(time.Hour) // rate 0, kept: allowance = limit
	w.minReturn = 40 << 10                                 // the client returns window as OpenSSH does
	ch := &recordingChannel{w: w}
	cw := &channelWriter{pacedWriter: pacedWriter{Channel: ch, window: w, limit: limit}}
	file := func(size int64) *os.File {
		f, err := os.CreateTemp(t.TempDir(), "response")
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	ack := func() { // the client reads everything sent so far
		w.cond.L.Lock()
		*win = window
		w.cond.L.Unlock()
		w.cond.Broadcast()
	}
	serve := func(size int64) <-chan error {
		f := file(size)
		done := make(chan error, 1)
		go func() {
			n, err := cw.ServeFile(f, size)
			if err == nil && n != size {
				err = fmt.Errorf("sent %d of %d bytes", n, size)
			}
			done <- err
		}()
		return done
	}
	wait := func(done <-chan error, what string) {
		t.Helper()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the writer waits for the client", what)
		}
	}
	// Known and small (the fake window is 2 MiB; x/crypto/ssh's own window
	// holds larger ones back): four times the limit, no wait.
	wait(serve(4*limit), "a small stored response")
	// Known and larger than unpacedMax: paced.
	ack()
	done := serve(unpacedMax + 1)
	time.Sleep(50 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("a response over unpacedMax was sent without an acknowledgement (%v)", err)
	default:
	}
	w.cond.L.Lock()
	unacked := w.unacked()
	w.cond.L.Unlock()
	if unacked > limit {
		t.Fatalf("%d bytes unacknowledged, want at most %d", unacked, limit)
	}
	go func() { // the client keeps reading
		for {
			select {
			case <-time.After(time.Millisecond):
				ack()
			case <-t.Context().Done():
				return
			}
		}
	}()
	wait(done, "a large stored response, acknowledged")
}

// TestStreamDoneUnpacedStreamFilePaced: a whole stretch of a recorded v0
// session (StreamDone) up to unpacedMax goes out without waiting; a stretch
// of a run in progress (StreamFile), whose whole size is not known, is
// paced.
func TestStreamDoneUnpacedStreamFilePaced(t *testing.T) {
	const window, limit = 2 << 20, 512 << 10
	w, _ := fakeWindow(window)
	w.rtt.Store(1)
	w.rated, w.rateSince = true, time.Now().Add(time.Hour) // allowance = limit
	w.minReturn = 40 << 10                                 // the client returns window as OpenSSH does
	cw := &channelWriter{pacedWriter: pacedWriter{Channel: &recordingChannel{w: w}, window: w, limit: limit}}
	f, err := os.CreateTemp(t.TempDir(), "recording")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(4 * limit); err != nil {
		t.Fatal(err)
	}
	if n, err := cw.StreamDone(f, 3*limit); err != nil || n != 3*limit {
		t.Fatalf("StreamDone: %d, %v", n, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		cw.StreamFile(f, limit)
	}()
	select {
	case <-done:
		t.Fatal("StreamFile sent past the limit without an acknowledgement")
	case <-time.After(50 * time.Millisecond):
	}
	w.cond.L.Lock()
	*w.closed = true // let the writer go
	w.cond.L.Unlock()
	w.cond.Broadcast()
	<-done
}

// stalledChannel is a session channel whose client reads nothing: a
// write blocks until the channel is closed.
type stalledChannel struct {
	gossh.Channel
	once   sync.Once
	closed chan struct{}
}

func (c *stalledChannel) Write(p []byte) (int, error) {
	<-c.closed
	return 0, io.EOF
}

func (c *stalledChannel) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

// TestServeFileIdleDeadline: a file sent to a client that stopped reading
// ends once the idle timeout passes with nothing written (the channel is
// closed), as the fetch cache's own chunked copy does; unpaced or not.
func TestServeFileIdleDeadline(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "response")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(1 << 20); err != nil {
		t.Fatal(err)
	}
	for _, send := range []func(*channelWriter) (int64, error){
		func(cw *channelWriter) (int64, error) { return cw.ServeFile(f, 1<<20) },
		func(cw *channelWriter) (int64, error) { f.Seek(0, io.SeekStart); return cw.StreamFile(f, 1<<20) },
	} {
		cw := &channelWriter{pacedWriter: pacedWriter{Channel: &stalledChannel{closed: make(chan struct{})}}, idle: 50 * time.Millisecond}
		done := make(chan error, 1)
		go func() {
			_, err := send(cw)
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil {
				t.Fatal("a stalled client was sent the whole file")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("sending to a stalled client did not end at the idle timeout")
		}
	}
}

// thresholdChannel is a session channel whose client returns window as
// jsch and libssh2 do: nothing until more than threshold is unreturned,
// then all of it at once (once it has read it: at once here).
type thresholdChannel struct {
	gossh.Channel
	w          *channelWindow
	threshold  uint32
	unreturned uint32
	returns    []uint32
}

func (c *thresholdChannel) Write(p []byte) (int, error) {
	c.w.cond.L.Lock()
	defer c.w.cond.L.Unlock()
	*c.w.win -= uint32(len(p))
	if c.unreturned += uint32(len(p)); c.unreturned > c.threshold {
		*c.w.win += c.unreturned
		c.returns = append(c.returns, c.unreturned)
		c.unreturned = 0
		c.w.cond.Broadcast()
	}
	return len(p), nil
}

// pacedWrite writes size bytes through a paced writer over ch's window at
// the default limit, the round trip and rate measured (allowance: the
// limit), and reports how long it took or that it did not end in 10 s.
func pacedWrite(t *testing.T, w *channelWindow, ch gossh.Channel, size int) time.Duration {
	t.Helper()
	w.rtt.Store(1)
	w.rated, w.rateSince = true, time.Now().Add(time.Hour)
	pw := pacedWriter{Channel: ch, window: w, limit: DefaultMaxUnacked}
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := pw.Write(make([]byte, size))
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		w.cond.L.Lock()
		t.Fatalf("the writer waits with %d KiB unacknowledged for a client that returns window only past its threshold", w.unacked()>>10)
	}
	return time.Since(start)
}

// TestPacingLetsThresholdClientsAdjust: a client that returns window only
// once more than half its 1 MiB window (jsch) or a quarter of its 2 MiB
// window (libssh2, once it has grown its window by its read buffer) is
// unreturned gets its whole output,
// at once (not through the stall fallback), and pacing still bounds what
// it holds to about its smallest return plus a piece. Before, the writer
// waited at 512 KiB unacknowledged for an adjust those clients send only
// past it.
func TestPacingLetsThresholdClientsAdjust(t *testing.T) {
	for _, tc := range []struct {
		name              string
		window, threshold uint32
	}{
		{"jsch", 1 << 20, 512 << 10},
		{"libssh2", 2 << 20, 512 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, _ := fakeWindow(tc.window)
			ch := &thresholdChannel{w: w, threshold: tc.threshold}
			took := pacedWrite(t, w, ch, 16<<20)
			w.cond.L.Lock()
			defer w.cond.L.Unlock()
			if w.stalled {
				t.Fatalf("the writer stalled (stallWait) before the client adjusted; took %v", took)
			}
			for _, r := range ch.returns {
				if r > tc.threshold+DefaultMaxUnacked/2 {
					t.Fatalf("the client returned %d KiB at once, want at most its threshold and a piece: %v", r>>10, ch.returns)
				}
			}
		})
	}
}

// TestPacingStallFallback: a client whose returns are small yet come only
// past a threshold above the limit (no known client does so) is not
// waited for forever: after stallWait with no return the channel is no
// longer paced.
func TestPacingStallFallback(t *testing.T) {
	w, _ := fakeWindow(2 << 20)
	w.minReturn = 40 << 10 // it once returned little
	ch := &thresholdChannel{w: w, threshold: 1 << 20}
	took := pacedWrite(t, w, ch, 4<<20)
	w.cond.L.Lock()
	stalled := w.stalled
	w.cond.L.Unlock()
	if !stalled || took < stallWait {
		t.Fatalf("stalled %v after %v: want the fallback after %v", stalled, took, stallWait)
	}
}
