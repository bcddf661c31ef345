package fetchcache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"packwire/internal/diskspace"
	"packwire/internal/filelru"
)

func newCache(t *testing.T, maxBytes int64) *Cache {
	t.Helper()
	c := &Cache{Dir: filepath.Join(t.TempDir(), "fetch"), MaxBytes: maxBytes, MaxAge: time.Hour, GitVersion: "git version test"}
	if err := c.Open(); err != nil {
		t.Fatal(err)
	}
	return c
}

// fileServer records whether a replay handed it the whole file.
type fileServer struct {
	bytes.Buffer
	served int
}

func (f *fileServer) ServeFile(file *os.File, size int64) (int64, error) {
	f.served++
	return io.CopyN(&f.Buffer, file, size)
}

func join(t *testing.T, c *Cache, key string) (*Reader, *Writer) {
	t.Helper()
	r, w, err := c.Join(key)
	if err != nil {
		t.Fatal(err)
	}
	return r, w
}

// replayAsync replays r into a buffer in the background.
func replayAsync(r *Reader, out io.Writer) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := r.Replay(context.Background(), out, time.Second)
		r.Close()
		done <- err
	}()
	return done
}

func TestKey(t *testing.T) {
	if Key([]byte("ab"), []byte("c")) == Key([]byte("a"), []byte("bc")) {
		t.Fatal("parts run together")
	}
	c := &Cache{GitVersion: "1"}
	d := &Cache{GitVersion: "2"}
	if c.Key([]byte("x")) == d.Key([]byte("x")) {
		t.Fatal("the git version is not in the key")
	}
}

// TestOneRunSharedThenStored: followers get every byte the leader's run
// writes, as it writes them; the finished response is stored and replayed
// whole (through ServeFile) with no run at all.
func TestOneRunSharedThenStored(t *testing.T) {
	c := newCache(t, 1<<20)
	leader, w := join(t, c, "k")
	if w == nil || !leader.Following() {
		t.Fatal("the first request does not lead")
	}
	var outs [3]bytes.Buffer
	dones := []<-chan error{replayAsync(leader, &outs[0])}
	for i := 1; i < 3; i++ {
		r, w2 := join(t, c, "k")
		if w2 != nil || !r.Following() {
			t.Fatalf("request %d does not follow the run", i)
		}
		dones = append(dones, replayAsync(r, &outs[i]))
	}
	if s := c.Stats(); s.Runs != 1 || s.Readers != 3 {
		t.Fatalf("stats %+v", s)
	}
	want := strings.Repeat("pack data ", 100_000) + "0000"
	for i := 0; i < len(want); i += 7777 {
		w.Write([]byte(want[i:min(i+7777, len(want))]))
	}
	w.Finish(nil)
	for i, d := range dones {
		if err := <-d; err != nil {
			t.Fatalf("reader %d: %v", i, err)
		}
		if outs[i].String() != want {
			t.Fatalf("reader %d got %d bytes, want %d", i, outs[i].Len(), len(want))
		}
	}
	if s := c.Stats(); s.Entries != 1 || s.Bytes != int64(len(want)) || s.Runs != 0 {
		t.Fatalf("stats %+v", s)
	}
	hit, w := join(t, c, "k")
	if w != nil || hit.Following() {
		t.Fatal("a stored response is not replayed")
	}
	var fs fileServer
	if n, err := hit.Replay(context.Background(), &fs, time.Second); err != nil || n != int64(len(want)) || fs.served != 1 || fs.String() != want {
		t.Fatalf("replay: %d %v, served whole %d times", n, err, fs.served)
	}
	hit.Close()
}

// TestIncompleteOrFailedRunsAreNotStored: a response that does not end
// with a flush, or a run that failed, is never stored; followers that have
// sent nothing get ErrGenerationFailed and may run git themselves.
func TestIncompleteOrFailedRunsAreNotStored(t *testing.T) {
	c := newCache(t, 1<<20)
	leader, w := join(t, c, "k")
	follower, _ := join(t, c, "k")
	var lout, fout bytes.Buffer
	ld, fd := replayAsync(leader, &lout), replayAsync(follower, &fout)
	w.Write([]byte("0008NAK\n"))
	w.Finish(nil) // git said it succeeded, but the response has no end
	if err := <-ld; !errors.Is(err, ErrGenerationFailed) || lout.String() != "0008NAK\n" {
		t.Fatalf("leader: %v %q", err, lout.String())
	}
	if err := <-fd; !errors.Is(err, ErrGenerationFailed) {
		t.Fatalf("follower: %v", err)
	}
	if s := c.Stats(); s.Entries != 0 {
		t.Fatalf("stored an incomplete response: %+v", s)
	}

	leader, w = join(t, c, "k")
	if w == nil {
		t.Fatal("a failed key has no new leader")
	}
	follower, _ = join(t, c, "k")
	fd = replayAsync(follower, io.Discard)
	w.Finish(errors.New("git exited with status 128"))
	if err := <-fd; !errors.Is(err, ErrGenerationFailed) {
		t.Fatalf("follower of a failed run: %v", err)
	}
	leader.Close()
	if entries, _ := os.ReadDir(c.Dir); len(entries) != 0 {
		t.Fatalf("files left: %v", entries)
	}
}

// TestReadersLeaving: a reader that leaves stops only itself; when the
// last one leaves an unfinished run, the producer is told to stop and the
// key starts over.
func TestReadersLeaving(t *testing.T) {
	c := newCache(t, 1<<20)
	leader, w := join(t, c, "k")
	var stopped sync.WaitGroup
	stopped.Add(1)
	var once sync.Once
	w.OnAbandon(func() { once.Do(stopped.Done) })
	ctx, cancel := context.WithCancel(context.Background())
	follower, _ := join(t, c, "k")
	fd := make(chan error, 1)
	go func() {
		_, err := follower.Replay(ctx, io.Discard, time.Second)
		follower.Close()
		fd <- err
	}()
	w.Write([]byte("0008NAK\n"))
	leader.Close() // the leader's client hangs up: the follower still reads
	if s := c.Stats(); s.Runs != 1 || s.Readers != 1 {
		t.Fatalf("after the leader left: %+v", s)
	}
	cancel() // and the follower too
	if err := <-fd; !errors.Is(err, context.Canceled) {
		t.Fatalf("follower: %v", err)
	}
	stopped.Wait() // the producer is stopped
	if s := c.Stats(); s.Runs != 0 {
		t.Fatalf("an abandoned run is still shared: %+v", s)
	}
	_, w2 := join(t, c, "k")
	if w2 == nil {
		t.Fatal("an abandoned key gets no new leader")
	}
	w.Finish(errors.New("killed")) // the old run ending must not disturb the new one
	if s := c.Stats(); s.Runs != 1 {
		t.Fatalf("the old run's end removed the new one: %+v", s)
	}
	w2.Write([]byte("0000"))
	w2.Finish(nil)
	if s := c.Stats(); s.Entries != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// TestAbandonBeforeProducerStarts: OnAbandon after every reader left stops
// the producer at once.
func TestAbandonBeforeProducerStarts(t *testing.T) {
	c := newCache(t, 1<<20)
	leader, w := join(t, c, "k")
	leader.Close()
	stopped := false
	w.OnAbandon(func() { stopped = true })
	if !stopped {
		t.Fatal("not stopped")
	}
	w.Finish(context.Canceled)
}

// TestBounds: responses over MaxBytes are shared but not kept, the least
// recently used goes first, and MaxAge ends a response's life.
// storeResponse runs key's response, size bytes, through c.
func storeResponse(t *testing.T, c *Cache, key string, size int) {
	t.Helper()
	r, w := join(t, c, key)
	if w == nil {
		t.Fatalf("%s: not a new run", key)
	}
	w.Write([]byte(strings.Repeat("x", size-4) + "0000"))
	w.Finish(nil)
	r.Close()
}

// isStored reports whether c replays key (which makes it the most
// recently used).
func isStored(t *testing.T, c *Cache, key string) bool {
	t.Helper()
	r, w, err := c.Join(key)
	if err != nil {
		t.Fatal(err)
	}
	if w != nil {
		w.Finish(errors.New("only looking"))
	}
	r.Close()
	return w == nil
}

func TestBounds(t *testing.T) {
	c := newCache(t, 100)
	store := func(key string, size int) { t.Helper(); storeResponse(t, c, key, size) }
	stored := func(key string) bool { t.Helper(); return isStored(t, c, key) }
	store("big", 101)
	if stored("big") {
		t.Fatal("a response over MaxBytes was kept")
	}
	store("a", 40)
	store("b", 40)
	if !stored("a") { // a is now the most recently used
		t.Fatal("a was not kept")
	}
	store("c", 40) // 120 > 100: b goes
	if stored("b") || !stored("a") || !stored("c") {
		t.Fatal("eviction did not drop the least recently used")
	}
	c.mu.Lock()
	c.stored.Now = func() time.Time { return time.Now().Add(2 * time.Hour) } // a and c are now past MaxAge
	c.mu.Unlock()
	c.Expire()
	if s := c.Stats(); s.Entries != 0 || s.Bytes != 0 {
		t.Fatalf("after expiry: %+v", s)
	}
	store("d", 40)
	if s := c.Stats(); s.Entries != 1 || s.Bytes != 40 || !stored("d") {
		t.Fatalf("a response stored after expiry: %+v", s)
	}
	files, _ := filepath.Glob(filepath.Join(c.Dir, "*"))
	if len(files) != 1 {
		t.Fatalf("files on disk: %v", files)
	}
}

// TestSetBounds: a larger bound keeps every stored response and takes
// more; a smaller one drops the least recently used down to it at once.
func TestSetBounds(t *testing.T) {
	c := newCache(t, 100)
	storeResponse(t, c, "a", 40)
	storeResponse(t, c, "b", 40)
	c.SetBounds(Bounds{MaxBytes: 200, MaxAge: time.Hour})
	storeResponse(t, c, "c", 40) // 120: over the old bound, under the new one
	if s := c.Stats(); s.Entries != 3 || s.Bytes != 120 {
		t.Fatalf("after a larger bound: %+v, want a, b and c kept", s)
	}
	isStored(t, c, "a") // a is now the most recently used, b the least
	c.SetBounds(Bounds{MaxBytes: 90, MaxAge: time.Hour})
	if s := c.Stats(); s.Entries != 2 || s.Bytes != 80 {
		t.Fatalf("after a smaller bound: %+v, want 2 responses", s)
	}
	if isStored(t, c, "b") || !isStored(t, c, "a") || !isStored(t, c, "c") {
		t.Fatal("the smaller bound did not drop the least recently used")
	}
	if files, _ := filepath.Glob(filepath.Join(c.Dir, "*.response")); len(files) != 2 {
		t.Fatalf("files on disk: %v", files)
	}
}

// TestStandsAside: nearly full disk or a file that cannot be made: the
// caller runs git without the cache.
func TestStandsAside(t *testing.T) {
	c := newCache(t, 1<<20)
	c.MinFreeBytes = 1 // the real file system has a byte free
	r, w, err := c.Join("k")
	if err != nil || w == nil {
		free, ferr := diskspace.Free(c.Dir)
		t.Fatalf("with a byte free asked: %v (free %d, %v)", err, free, ferr)
	}
	w.Finish(errors.New("only looking"))
	r.Close()
	c.MinFreeBytes = 1 << 62
	if _, _, err := c.Join("k"); !errors.Is(err, ErrStandAside) {
		t.Fatalf("disk full: %v", err)
	}
	c.MinFreeBytes = 0
	c.createTemp = func(string, string) (*os.File, error) { return nil, errors.New("no space left on device") }
	if _, _, err := c.Join("k"); !errors.Is(err, ErrStandAside) {
		t.Fatalf("cannot create: %v", err)
	}
	if s := c.Stats(); s.Runs != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestOpenEmptiesTheDirectory: nothing from an earlier process is trusted.
func TestOpenEmptiesTheDirectory(t *testing.T) {
	c := newCache(t, 1<<20)
	os.WriteFile(filepath.Join(c.Dir, "old.response"), []byte("0000"), 0o600)
	if err := c.Open(); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(c.Dir); len(entries) != 0 {
		t.Fatalf("left: %v", entries)
	}
	if err := (&Cache{}).Open(); err == nil {
		t.Fatal("a cache without a directory opened")
	}
}

// TestProducerWritesTheFile: a producer writing the file itself (git's
// stdout) is followed by watching the file grow.
func TestProducerWritesTheFile(t *testing.T) {
	c := newCache(t, 1<<20)
	leader, w := join(t, c, "k")
	follower, _ := join(t, c, "k")
	var lout, fout bytes.Buffer
	ld, fd := replayAsync(leader, &lout), replayAsync(follower, &fout)
	f := w.File()
	want := strings.Repeat("sideband pack data", 20_000) + "0000"
	for i := 0; i < len(want); i += 50_000 {
		f.WriteString(want[i:min(i+50_000, len(want))])
		time.Sleep(2 * time.Millisecond)
	}
	w.Finish(nil)
	for i, d := range []<-chan error{ld, fd} {
		if err := <-d; err != nil {
			t.Fatalf("reader %d: %v", i, err)
		}
	}
	if lout.String() != want || fout.String() != want {
		t.Fatalf("got %d and %d bytes, want %d", lout.Len(), fout.Len(), len(want))
	}
	if s := c.Stats(); s.Entries != 1 || s.Bytes != int64(len(want)) {
		t.Fatalf("stats %+v", s)
	}
}

// response runs a producer for w (if it leads) that writes a small valid
// response, replays r to the end, and tells whether this request led.
func response(t *testing.T, r *Reader, w *Writer) bool {
	t.Helper()
	if w != nil {
		w.Write([]byte("0008NAK\n0000"))
		w.Finish(nil)
	}
	var out bytes.Buffer
	if _, err := r.Replay(context.Background(), &out, time.Second); err != nil {
		t.Fatal(err)
	}
	r.Close()
	return w != nil
}

// TestIncrementalStoredOnSecondSighting: a response to a request with
// haves is not stored the first time; the second identical request
// within the window runs git again and stores it; the third is replayed.
// Outside the window the count starts over. A follower of a run in
// progress counts as the second sighting.
func TestIncrementalStoredOnSecondSighting(t *testing.T) {
	c := newCache(t, 1<<20)
	c.SightingWindow = time.Hour
	lead := func(key string) bool {
		t.Helper()
		r, w, err := c.JoinIncremental(key)
		if err != nil {
			t.Fatal(err)
		}
		return response(t, r, w)
	}
	if !lead("a") || !lead("a") || lead("a") {
		t.Fatal("want: run, run (stored), replay")
	}
	if c.Stats().Entries != 1 {
		t.Fatalf("entries %d", c.Stats().Entries)
	}

	c.SightingWindow = time.Nanosecond
	if !lead("b") {
		t.Fatal("b did not lead")
	}
	time.Sleep(time.Millisecond)
	if !lead("b") || !lead("b") {
		t.Fatal("b was stored although its sightings are further apart than the window")
	}

	// Followers: a herd shares the run, and the run is stored.
	c.SightingWindow = time.Hour
	leader, w, _ := c.JoinIncremental("herd")
	follower, fw, _ := c.JoinIncremental("herd")
	if w == nil || fw != nil {
		t.Fatal("the second request of a herd does not follow the run")
	}
	response(t, leader, w)
	response(t, follower, nil)
	if r, w2, _ := c.JoinIncremental("herd"); w2 != nil {
		t.Fatal("a herd's response was not stored")
	} else {
		response(t, r, nil)
	}

	// Join (a clone) stores at once.
	if !lead2(t, c, "clone") || lead2(t, c, "clone") {
		t.Fatal("a clone's response was not stored on its first run")
	}
}

func lead2(t *testing.T, c *Cache, key string) bool {
	t.Helper()
	r, w := join(t, c, key)
	return response(t, r, w)
}

// BenchmarkAdmission simulates a server's fetch traffic against a cache
// bounded in bytes and reports the share of requests that needed no git
// run, by policy: every incremental response stored ("admit-all") or only
// on its second sighting ("second-sighting", what JoinIncremental does).
// The traffic: clones of a few hot repositories (Zipf-like), a push now
// and then after which a herd of CI runners at the previous commit fetch
// together (some retrying later), and one-off incremental fetches (each
// its own haves) that make up most incremental requests, as GitLab found
// (~75% of its pack cache entries were never read twice).
func BenchmarkAdmission(b *testing.B) {
	const (
		requests   = 200000
		repos      = 50
		cloneBytes = 20 << 20 // a clone's response
		fetchBytes = 1 << 20  // an incremental fetch's
		capacity   = 400 << 20
		herd       = 16
	)
	for _, policy := range []string{"admit-all", "second-sighting"} {
		b.Run(policy, func(b *testing.B) {
			var cloneHit, clones, incHit, incs float64
			for i := 0; i < b.N; i++ {
				rng := rand.New(rand.NewPCG(1, uint64(i)))
				set := filelru.Set{MaxBytes: capacity}
				seen := map[string]int{}
				version := make([]int, repos)
				serve := func(key string, size int64, incremental bool) bool {
					if _, _, ok := set.Lookup(key); ok {
						return true
					}
					seen[key]++
					if !incremental || policy == "admit-all" || seen[key] > 1 {
						set.Add(key, "/nonexistent/"+key, size)
					}
					return false
				}
				for n := 0; n < requests; {
					repo := int(float64(repos) * math.Pow(rng.Float64(), 3)) // a few hot ones
					switch x := rng.Float64(); {
					case x < 0.5: // a clone of the repository as it is
						clones++
						if serve(fmt.Sprintf("clone %d@%d", repo, version[repo]), cloneBytes, false) {
							cloneHit++
						}
						n++
					case x < 0.52: // a push, then a herd of runners at the old commit
						version[repo]++
						key := fmt.Sprintf("ci %d@%d", repo, version[repo])
						// The runners start together: all but the first follow
						// the run in progress (hits under both policies), and
						// following is the response's second sighting.
						incs += herd
						incHit += herd - 1
						if serve(key, fetchBytes, true) {
							incHit++
						} else {
							set.Add(key, "/nonexistent/"+key, fetchBytes)
						}
						if rng.Float64() < 0.5 { // a retry or a later pipeline
							incs++
							if serve(key, fetchBytes, true) {
								incHit++
							}
						}
						n += herd
					default: // a one-off incremental fetch
						incs++
						if serve(fmt.Sprintf("one-off %d", rng.Uint64()), fetchBytes, true) {
							incHit++
						}
						n++
					}
				}
			}
			b.ReportMetric(cloneHit/clones, "clone-hit-rate")
			b.ReportMetric(incHit/incs, "incremental-hit-rate")
			b.ReportMetric((cloneHit+incHit)/(clones+incs), "hit-rate")
		})
	}
}

// lockedStreams is a transport's writer that sends files itself (with
// DoneStreamer), safe to look at while a replay writes to it.
type lockedStreams struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	calls []string
	gate  chan struct{} // the first stream call waits for it to close (nil: no wait)
	once  sync.Once
}

func (w *lockedStreams) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls = append(w.calls, "Write")
	return w.buf.Write(p)
}

func (w *lockedStreams) stream(call string, f *os.File, n int64) (int64, error) {
	w.once.Do(func() {
		w.mu.Lock()
		w.calls = append(w.calls, "waiting")
		w.mu.Unlock()
		if w.gate != nil {
			<-w.gate
		}
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls = append(w.calls, call)
	return io.CopyN(&w.buf, f, n)
}

func (w *lockedStreams) StreamFile(f *os.File, n int64) (int64, error) {
	return w.stream("StreamFile", f, n)
}

func (w *lockedStreams) StreamDone(f *os.File, n int64) (int64, error) {
	return w.stream("StreamDone", f, n)
}

func (w *lockedStreams) snapshot() ([]string, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.calls), w.buf.String()
}

// TestReplayRestOfEndedRunIsDone: a follower is sent a run's output
// through StreamFile while the run goes on (more may come: the SSH
// transport paces it), and what is left once the run ended well through
// StreamDone.
func TestReplayRestOfEndedRunIsDone(t *testing.T) {
	c := newCache(t, 1<<20)
	leader, w := join(t, c, "k")
	defer leader.Close()
	follower, _ := join(t, c, "k")
	out := &lockedStreams{gate: make(chan struct{})}
	done := replayAsync(follower, out)
	first := strings.Repeat("x", 1<<20+HoldBack) // past the writer's batching of wake-ups
	w.Write([]byte(first))
	deadline := time.Now().Add(5 * time.Second)
	for calls, _ := out.snapshot(); len(calls) == 0; calls, _ = out.snapshot() {
		if time.Now().After(deadline) {
			t.Fatal("the follower sent nothing of a run past HoldBack")
		}
		time.Sleep(time.Millisecond)
	}
	// While the follower sends the first stretch, the run writes the rest
	// and ends.
	w.Write([]byte("rest0000"))
	w.Finish(nil)
	close(out.gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	calls, got := out.snapshot()
	if got != first+"rest0000" {
		t.Fatalf("follower got %d bytes, want %d", len(got), len(first)+8)
	}
	if want := []string{"waiting", "StreamFile", "StreamDone"}; !slices.Equal(calls, want) {
		t.Fatalf("calls %v, want %v: StreamFile while the run went on, then StreamDone", calls, want)
	}
}
