// Package fetchcache stores whole responses to stateless protocol v2
// fetches that have no haves (full, shallow and filtered clones) and
// replays them to identical requests without running git.
//
// Such a response is a function of the request body, the repository's
// refs, config and objects, and git's version and settings: the caller
// keys it on all of those (see Key and internal/repostate). The first
// request for a key leads: it runs git with its output going into a file
// here, and every identical request that arrives meanwhile follows that
// file as it grows (one git for the whole herd). A finished, successful
// response is renamed into place and replayed, with sendfile where the
// transport can, until it ages out or is evicted. Entries are never
// invalidated by hand: a changed ref or config makes a new key.
package fetchcache

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"packwire/internal/diskspace"
	"packwire/internal/filelru"
	"packwire/internal/growfile"
)

// Outcome strings the governor records for requests the cache served.
const (
	// Generated: this request ran git and its output was shared (and stored).
	Generated = "generated"
	// Replayed: this request was served from the cache, no git spawned.
	Replayed = "replayed"
)

// ErrStandAside means the cache cannot take this response (disk nearly
// full, a file could not be created): run git without it.
var ErrStandAside = errors.New("fetch cache standing aside")

// ErrGenerationFailed is what followers get when the run they followed
// did not complete.
var ErrGenerationFailed = errors.New("the shared git run failed")

// Cache holds stored responses and the runs in progress. Its exported
// fields are its configuration; call Open before use, and change the
// bounds of a cache in use with SetBounds.
type Cache struct {
	Dir          string        // where responses are written (emptied at Open)
	MaxBytes     int64         // total size of stored responses; 0: share runs in progress only
	MaxAge       time.Duration // a stored response older than this is dropped; 0: no age bound
	MinFreeBytes int64         // with less free disk than this, stand aside
	GitVersion   string        // part of every key
	Log          *slog.Logger
	// SightingWindow is how recently an identical request must have been
	// seen for the response to a request with haves to be stored (0:
	// DefaultSightingWindow). Identical requests running at once always
	// share one run, whatever this says; see JoinIncremental.
	SightingWindow time.Duration

	// createTemp is os.CreateTemp, replaceable in tests to inject disk errors.
	createTemp func(dir, pattern string) (*os.File, error)

	mu       sync.Mutex
	inflight map[string]*generation
	seen     map[string]time.Time // when an incremental request was last seen, by key
	stored   filelru.Set          // finished responses
	disk     diskspace.Bound      // the free-space bound's last answer
}

// storedLocked is the finished responses, bounded by the cache's current
// MaxBytes and MaxAge.
func (c *Cache) storedLocked() *filelru.Set {
	c.stored.MaxBytes, c.stored.MaxAge = c.MaxBytes, c.MaxAge
	return &c.stored
}

// generation is one git run whose output is being written to a file.
type generation struct {
	key     string
	path    string
	readers int // under Cache.mu
	joined  int // requests that read this run, ever; under Cache.mu
	// probation: a response to an incremental request whose key was not
	// seen within SightingWindow; stored only if another request joins it.
	probation bool
	abandon   func()      // stops the producer once nobody reads; under Cache.mu
	log       *sessionLog // a recorded session's input and pieces (session.go); nil for a fetch response
	*growfile.Growth
}

// Open makes the directory, removing what an earlier process left there:
// a file from before a restart is never trusted.
func (c *Cache) Open() error {
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.createTemp == nil {
		c.createTemp = os.CreateTemp
	}
	if c.Dir == "" {
		return errors.New("fetch cache: no directory")
	}
	os.RemoveAll(c.Dir)
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return fmt.Errorf("fetch cache: %w", err)
	}
	c.mu.Lock()
	c.inflight = map[string]*generation{}
	c.seen = map[string]time.Time{}
	c.stored = filelru.Set{}
	c.mu.Unlock()
	return nil
}

// Key is the SHA-256 of parts, each length-prefixed so that no two
// different lists of parts can run together into the same bytes.
func Key(parts ...[]byte) string {
	h := sha256.New()
	var n [8]byte
	for _, p := range parts {
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write(p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Key is the key of a response: the cache's git version and parts.
func (c *Cache) Key(parts ...[]byte) string {
	return Key(append([][]byte{[]byte(c.GitVersion)}, parts...)...)
}

// Join looks key up. It returns a Reader that replays the stored response
// or follows the run in progress; or, when neither exists, a Writer that
// the caller must fill by running git (and Finish), together with a Reader
// of it for the caller's own client. With ErrStandAside the caller runs
// git without the cache.
func (c *Cache) Join(key string) (*Reader, *Writer, error) {
	return c.join(key, false)
}

// DefaultSightingWindow is the SightingWindow of a zero Cache: CI runners
// that sit at the same commit fetch within minutes of a push (the herd
// runs at once, retries and later pipelines within the hour).
const DefaultSightingWindow = 15 * time.Minute

// maxSightings bounds the keys remembered for their second sighting: a key
// and a time are about 100 bytes, so this is a few MiB at most.
const maxSightings = 1 << 15

// JoinIncremental is Join for a request with haves (an incremental
// fetch). Most such requests are one-offs: a developer's fetch, a runner
// at a commit nobody else has. Storing each would evict the clones that
// are replayed many times, for entries read never again. So its response
// is stored only when the request was seen before within SightingWindow,
// or when another identical request followed the run: the second sighting.
// Identical requests running at once share the run either way, so a herd
// of CI runners costs one git run even when nothing is stored.
func (c *Cache) JoinIncremental(key string) (*Reader, *Writer, error) {
	return c.join(key, true)
}

// sightedLocked records a sighting of key and tells whether it had been
// seen within the window before.
func (c *Cache) sightedLocked(key string, now time.Time) bool {
	window := c.SightingWindow
	if window <= 0 {
		window = DefaultSightingWindow
	}
	last, ok := c.seen[key]
	if len(c.seen) >= maxSightings {
		for k, t := range c.seen {
			if now.Sub(t) > window {
				delete(c.seen, k)
			}
		}
		if len(c.seen) >= maxSightings {
			clear(c.seen) // a flood of distinct requests: start over
		}
	}
	c.seen[key] = now
	return ok && now.Sub(last) <= window
}

func (c *Cache) join(key string, incremental bool) (*Reader, *Writer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	seenBefore := false
	if incremental {
		seenBefore = c.sightedLocked(key, time.Now())
	}
	if path, size, ok := c.storedLocked().Lookup(key); ok {
		f, err := os.Open(path)
		if err == nil {
			return &Reader{f: f, size: size}, nil, nil
		}
		c.stored.Drop(key) // its file is gone: forget it
	}
	if g, ok := c.inflight[key]; ok {
		// The file keeps its name until the run ends, which takes c.mu.
		f, err := os.Open(g.path)
		if err == nil {
			g.readers++
			g.joined++
			return &Reader{f: f, g: g, c: c}, nil, nil
		}
	}
	return c.startLocked(key, incremental && !seenBefore, false)
}

// startLocked makes the run of key (empty: a session recording published
// later): the file git's output goes to, the leader's Reader of it, and
// its Writer (with a recorder for a session).
func (c *Cache) startLocked(key string, probation, session bool) (*Reader, *Writer, error) {
	switch enough, changed := c.disk.Check(c.Dir, c.MinFreeBytes); {
	case !enough:
		if changed {
			c.Log.Warn("fetch cache: disk nearly full, running git without it until there is room", "dir", c.Dir, "min_free_bytes", c.MinFreeBytes)
		}
		return nil, nil, ErrStandAside
	case changed:
		c.Log.Info("fetch cache: disk has room again", "dir", c.Dir)
	}
	prefix := key[:min(len(key), 16)]
	if prefix == "" {
		prefix = "session"
	}
	w, err := c.createTemp(c.Dir, prefix+".*.tmp")
	if err != nil {
		c.Log.Warn("fetch cache: cannot create a file, running git without it", "error", err.Error())
		return nil, nil, fmt.Errorf("%w: %v", ErrStandAside, err)
	}
	f, err := os.Open(w.Name())
	if err != nil {
		w.Close()
		os.Remove(w.Name())
		return nil, nil, fmt.Errorf("%w: %v", ErrStandAside, err)
	}
	g := &generation{key: key, path: w.Name(), readers: 1, joined: 1, probation: probation, Growth: growfile.New()}
	if key != "" {
		c.inflight[key] = g
	}
	reader := &Reader{f: f, g: g, c: c, leads: true}
	writer := &Writer{g: g, c: c, out: growfile.Writer{F: w, G: g.Growth}}
	if session {
		g.log = newSessionLog()
		writer.recorder = &SessionRecorder{c: c, w: writer, lead: reader, log: g.log}
	}
	return reader, writer, nil
}

// leave is a reader of g going away. When the last one leaves a run that
// is still going, nobody is left to want it: the run is forgotten (a new
// request starts over) and its producer stopped.
func (c *Cache) leave(g *generation) {
	c.mu.Lock()
	defer c.mu.Unlock()
	g.readers--
	if g.readers > 0 {
		return
	}
	if _, done, _ := g.State(); done {
		return
	}
	if c.inflight[g.key] == g {
		delete(c.inflight, g.key)
	}
	if g.abandon != nil {
		g.abandon()
		g.abandon = nil
	}
}

// finish ends a run of size bytes: a complete response is stored,
// anything else removed.
func (c *Cache) finish(g *generation, size int64, err error) {
	c.mu.Lock()
	if c.inflight[g.key] == g {
		delete(c.inflight, g.key)
	}
	if g.key == "" {
		err = errors.Join(err, errors.New("never published")) // a session recording nobody could follow
	}
	final := filepath.Join(c.Dir, g.key+".response")
	keep := err == nil && c.MaxBytes > 0 && size <= c.MaxBytes && (!g.probation || g.joined > 1)
	if keep && os.Rename(g.path, final) == nil {
		c.storedLocked().Add(g.key, final, size)
	} else {
		// Readers holding the file keep reading it; the name goes now.
		os.Remove(g.path)
	}
	g.abandon = nil
	c.mu.Unlock()

	if err != nil {
		err = fmt.Errorf("%w: %v", ErrGenerationFailed, err)
	}
	g.End(size, err)
}

// Bounds are the limits of a Cache that SetBounds changes while it serves.
type Bounds struct {
	MaxBytes, MinFreeBytes int64
	MaxAge, SightingWindow time.Duration
}

// SetBounds changes the cache's limits while it serves (a configuration
// reload). What no longer fits a lower MaxBytes or MaxAge is dropped at
// once, least recently used first; every other stored response is kept.
// Runs in progress go on, and are kept or not by the new bounds.
func (c *Cache) SetBounds(b Bounds) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.MaxBytes, c.MinFreeBytes, c.MaxAge, c.SightingWindow = b.MaxBytes, b.MinFreeBytes, b.MaxAge, b.SightingWindow
	c.storedLocked().Evict()
}

// Expire drops responses past MaxAge; the server calls it now and then.
func (c *Cache) Expire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.storedLocked().Evict()
}

// Stats is what the cache holds and does now.
type Stats struct {
	Entries  int   // stored responses
	Bytes    int64 // their total size
	Runs     int   // git runs being shared
	Readers  int   // requests reading those runs (their leaders included)
	RunBytes int64 // what those runs wrote so far
}

// Stats returns the cache's current state.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := Stats{Entries: c.stored.Len(), Bytes: c.stored.Bytes(), Runs: len(c.inflight)}
	for _, g := range c.inflight {
		s.Readers += g.readers
		size, _, _ := g.State()
		s.RunBytes += size
	}
	return s
}

// Writer receives the output of the git run that leads a key: written
// through Write, or by git itself into File.
type Writer struct {
	g         *generation
	c         *Cache
	out       growfile.Writer // the response file and its growth
	watchOnce sync.Once
	stopWatch func()
	recorder  *SessionRecorder // a session recording's (session.go)
}

// OnAbandon sets what stops the producer when every reader has left
// before the end (typically cancelling git's context). It is called at
// most once, never after Finish.
func (w *Writer) OnAbandon(stop func()) {
	w.c.mu.Lock()
	defer w.c.mu.Unlock()
	if w.g.readers == 0 {
		stop() // everybody left already
		return
	}
	w.g.abandon = stop
}

// Write appends to the response and wakes its readers. (The pipeline has
// git write the file itself, see File; Write is for producers in Go.)
func (w *Writer) Write(p []byte) (int, error) {
	return w.out.Write(p)
}

// watchEvery is how often the size of a file git writes itself is looked
// at: a stat costs a microsecond, and clients get git's bytes at most
// this much later.
const watchEvery = 5 * time.Millisecond

// File returns the response file for a producer that writes it itself
// (git's stdout, with no copy through packwire); the Writer then watches
// its size and wakes readers as it grows. Write must not be used then.
func (w *Writer) File() *os.File {
	w.watchOnce.Do(func() { w.stopWatch = growfile.Watch(w.out.F, w.g.Growth, watchEvery) })
	return w.out.F
}

// Finish ends the run. err nil means git succeeded and wrote its whole
// response: it is then stored if it ends as a response must (with a flush
// packet) and fits the size bound. Otherwise the file is dropped, and
// followers that have sent nothing yet fall back.
func (w *Writer) Finish(err error) {
	if w.stopWatch != nil {
		w.stopWatch()
	}
	var size int64
	if fi, serr := w.out.F.Stat(); serr == nil {
		size = fi.Size()
	} else if err == nil {
		err = serr
	}
	if err == nil {
		var tail [4]byte
		if n, _ := w.out.F.ReadAt(tail[:], size-4); size < 4 || n != 4 || string(tail[:]) != "0000" {
			err = errors.New("the response does not end with a flush packet")
		}
	}
	if cerr := w.out.F.Close(); err == nil && cerr != nil {
		err = cerr
	}
	w.c.finish(w.g, size, err)
}
