// Package packcache shares pack generation between identical requests.
// upload-pack runs pack-objects through uploadpack.packObjectsHook; the hook
// (packwire's own binary, see hook.go) hands the arguments and input to the
// server, which runs `git pack-objects` once per key and streams the output
// to every waiter from a file as it grows: memory does not grow with pack
// size times clients, and a client that leaves stops nothing but its own
// reading. Finished packs stay for reuse within an age and size bound.
package packcache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"packwire/internal/diskspace"
	"packwire/internal/filelru"
	"packwire/internal/gitexec"
	"packwire/internal/growfile"
	"packwire/internal/procgroup"
)

// Outcome says how a request's pack was produced; the governor records it.
type Outcome string

const (
	Generated Outcome = "generated" // this request started the pack-objects run
	Joined    Outcome = "joined"    // streamed a run another request started
	Hit       Outcome = "hit"       // served from a finished pack on disk
	Direct    Outcome = "direct"    // the cache stood aside; the hook ran pack-objects itself
)

// Request is what the hook sends: pack-objects' command line, the
// repository, the config git passed down, and pack-objects' whole stdin.
type Request struct {
	RequestID string   `json:"request_id"`
	RepoPath  string   `json:"repo_path"`
	Args      []string `json:"args"`   // "git", "pack-objects", ...
	Config    string   `json:"config"` // GIT_CONFIG_PARAMETERS
	Protocol  string   `json:"protocol"`
	StdinSize int      `json:"stdin_size"`
}

// Cache is the shared-generation service. Its exported fields are its
// configuration; Open prepares the directory, and SetBounds changes the
// bounds of a cache in use.
type Cache struct {
	Dir          string        // where packs are written (wiped at Open)
	MaxBytes     int64         // total size of finished packs kept; 0: keep none
	MaxAge       time.Duration // finished packs older than this are dropped (0: only by MaxBytes)
	MinUses      int           // keep a finished pack only once its key was asked this often (>= 1)
	MinFreeBytes int64         // below this much free disk, stand aside (direct)
	GitVersion   string        // part of every key
	GitPath      string        // the git the server runs (default "git"); the hook's argv[0] is never run
	Log          *slog.Logger

	// createFile is os.Create, replaceable in tests to inject disk errors.
	createFile func(string) (*os.File, error)

	mu       sync.Mutex
	inflight map[string]*generation
	done     filelru.Set     // finished packs
	disk     diskspace.Bound // the free-space bound's last answer
	uses     map[string]int
	outcomes map[string]Taken // by request id, until the pipeline takes it
}

// Taken is how a request's pack was produced and, when the request
// started the run, the CPU pack-objects spent on it: that process is the
// server's child, not upload-pack's, so upload-pack's own usage misses it.
type Taken struct {
	Outcome         Outcome
	UserCPU, SysCPU time.Duration
}

// doneLocked is the finished packs, bounded by the cache's current
// MaxBytes and MaxAge.
func (c *Cache) doneLocked() *filelru.Set {
	c.done.MaxBytes, c.done.MaxAge = c.MaxBytes, c.MaxAge
	return &c.done
}

// generation is one pack-objects run; readers follow its file.
type generation struct {
	path string
	*growfile.Growth
}

// Open makes the cache directory, removing what an earlier run left (a
// partial file is never trusted).
func (c *Cache) Open() error {
	if c.MinUses < 1 {
		c.MinUses = 1
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.createFile == nil {
		c.createFile = os.Create
	}
	os.RemoveAll(c.Dir)
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return err
	}
	c.inflight = map[string]*generation{}
	c.done = filelru.Set{}
	c.uses = map[string]int{}
	c.outcomes = map[string]Taken{}
	return nil
}

// Key identifies identical pack generations.
func (c *Cache) Key(req Request, stdin []byte) string {
	h := sha256.New()
	for _, part := range []string{c.GitVersion, req.RepoPath, strings.Join(req.Args, "\x00"), req.Config, req.Protocol} {
		fmt.Fprintf(h, "%d:%s\n", len(part), part)
	}
	h.Write(stdin)
	return hex.EncodeToString(h.Sum(nil))
}

// ErrStandAside means the hook should run pack-objects itself.
var ErrStandAside = errors.New("pack cache standing aside")

// Serve writes the pack for req to out, sharing or reusing a generation.
// It returns ErrStandAside when the request is better run directly.
func (c *Cache) Serve(ctx context.Context, req Request, stdin []byte, out io.Writer) (Outcome, error) {
	// Only "git pack-objects ... --stdout" is served, with the server's own
	// git: whatever reaches the socket never chooses what runs.
	if len(req.Args) < 2 || req.Args[0] != "git" || req.Args[1] != "pack-objects" || !contains(req.Args, "--stdout") {
		return c.standAside(req)
	}
	key := c.Key(req, stdin)
	c.mu.Lock()
	c.uses[key]++
	if len(c.uses) > 100_000 { // bound the occurrence counts
		c.uses = map[string]int{key: c.uses[key]}
	}
	if path, _, ok := c.doneLocked().Lookup(key); ok { // an expired one is dropped here
		c.mu.Unlock()
		f, err := os.Open(path)
		if err == nil {
			defer f.Close()
			bufp := gitexec.CopyBuffers.Get().(*[]byte)
			defer gitexec.CopyBuffers.Put(bufp)
			_, err = io.CopyBuffer(out, struct{ io.Reader }{f}, *bufp)
			c.setOutcome(req.RequestID, Hit)
			return Hit, err
		}
		c.mu.Lock()
		c.done.DropIfPath(key, path) // unless replaced meanwhile
	}
	g, joined := c.inflight[key]
	outcome := Joined
	if !joined {
		outcome = Generated
	}
	// In place before a run can end and charge its CPU (a stand-aside
	// below replaces it).
	c.setOutcomeLocked(req.RequestID, outcome)
	if !joined {
		minFree := c.MinFreeBytes
		enough, changed := c.disk.Check(c.Dir, minFree)
		if !enough {
			c.mu.Unlock()
			if changed {
				c.Log.Warn("pack cache: disk nearly full, running pack-objects directly until there is room", "dir", c.Dir, "min_free_bytes", minFree)
			}
			return c.standAside(req)
		}
		if changed {
			c.Log.Info("pack cache: disk has room again", "dir", c.Dir)
		}
		f, err := c.createFile(filepath.Join(c.Dir, key+".tmp"))
		if err != nil {
			c.mu.Unlock()
			c.Log.Warn("pack cache: cannot create a file, running pack-objects directly", "error", err.Error())
			return c.standAside(req)
		}
		g = &generation{path: f.Name(), Growth: growfile.New()}
		c.inflight[key] = g
		go c.generate(key, g, f, req, stdin)
	}
	c.mu.Unlock()
	return outcome, g.follow(ctx, out)
}

func (c *Cache) standAside(req Request) (Outcome, error) {
	c.setOutcome(req.RequestID, Direct)
	return Direct, ErrStandAside
}

// generate runs pack-objects into f, detached from every request: no
// client's departure can stop it while others read.
func (c *Cache) generate(key string, g *generation, f *os.File, req Request, stdin []byte) {
	git := c.GitPath
	if git == "" {
		git = "git"
	}
	cmd := exec.Command(git, req.Args[1:]...)
	cmd.Dir = req.RepoPath
	cmd.Env = append(gitexec.Environ(), "GIT_CONFIG_PARAMETERS="+req.Config, "GIT_PROTOCOL="+req.Protocol)
	cmd.Stdin = strings.NewReader(string(stdin))
	cmd.Stdout = &growfile.Writer{F: f, G: g.Growth}
	var stderr tail
	cmd.Stderr = &stderr
	// No fsync: the cache is wiped at every start, so durability buys nothing.
	// Its own process group: a Ctrl-C at packwire's terminal does not reach
	// it, and on Linux it dies with packwire.
	err := procgroup.Start(cmd)
	if err == nil {
		err = cmd.Wait()
	}
	if cmd.ProcessState != nil {
		// Charged to the request that started the run, before any reader
		// can finish (End below): its record is written after it.
		u := procgroup.UsageOf(cmd.ProcessState)
		c.chargeCPU(req.RequestID, u.UserCPU, u.SysCPU)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		err = fmt.Errorf("pack-objects: %w: %s", err, stderr.String())
		c.Log.Warn("pack cache: generation failed", "key", key[:12], "error", err.Error())
	}

	size, _, _ := g.State()
	c.mu.Lock()
	delete(c.inflight, key)
	final := strings.TrimSuffix(g.path, ".tmp") + ".pack"
	keep := err == nil && c.uses[key] >= c.MinUses && c.MaxBytes > 0 && size <= c.MaxBytes
	if keep && os.Rename(g.path, final) == nil {
		c.doneLocked().Add(key, final, size)
	} else {
		// Readers still holding the file keep reading it; the name goes now.
		os.Remove(g.path)
	}
	c.mu.Unlock()
	g.End(size, err)
}

// Bounds are the limits of a Cache that SetBounds changes while it serves.
type Bounds struct {
	MaxBytes, MinFreeBytes int64
	MaxAge                 time.Duration
	MinUses                int
}

// SetBounds changes the cache's limits while it serves (a configuration
// reload). What no longer fits a lower MaxBytes or MaxAge is dropped at
// once, least recently used first; every other finished pack is kept.
// Runs in progress go on, and are kept or not by the new bounds.
func (c *Cache) SetBounds(b Bounds) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.MaxBytes, c.MinFreeBytes, c.MaxAge, c.MinUses = b.MaxBytes, b.MinFreeBytes, b.MaxAge, max(b.MinUses, 1)
	c.doneLocked().Evict()
}

// Expire drops packs past MaxAge; the server calls it now and then.
func (c *Cache) Expire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.doneLocked().Evict()
}

// Stats is the cache's current size.
func (c *Cache) Stats() (packs int, bytes int64, inflight int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done.Len(), c.done.Bytes(), len(c.inflight)
}

func (c *Cache) setOutcome(requestID string, o Outcome) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setOutcomeLocked(requestID, o)
}

func (c *Cache) setOutcomeLocked(requestID string, o Outcome) {
	if requestID == "" {
		return
	}
	if len(c.outcomes) > 10_000 { // a request that never collected its outcome
		c.outcomes = map[string]Taken{}
	}
	t := c.outcomes[requestID]
	t.Outcome = o
	c.outcomes[requestID] = t
}

// chargeCPU adds a run's pack-objects CPU to the request that started it.
// A request already recorded (its client left before the run ended) has
// taken its outcome: the CPU then goes unrecorded rather than pile up.
func (c *Cache) chargeCPU(requestID string, user, sys time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.outcomes[requestID]
	if requestID == "" || !ok {
		return
	}
	t.UserCPU += user
	t.SysCPU += sys
	c.outcomes[requestID] = t
}

// TakeOutcome returns and forgets how a request's pack was produced, and
// the pack-objects CPU charged to it.
func (c *Cache) TakeOutcome(requestID string) Taken {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.outcomes[requestID]
	delete(c.outcomes, requestID)
	return t
}

// follow streams the generation's file to out as it grows, until the run
// ends. Cancelling ctx stops only this reader.
func (g *generation) follow(ctx context.Context, out io.Writer) error {
	f, err := os.Open(g.path)
	if err != nil {
		return err
	}
	defer f.Close()
	bufp := gitexec.CopyBuffers.Get().(*[]byte)
	defer gitexec.CopyBuffers.Put(bufp)
	buf := *bufp
	var off int64
	for {
		size, done, genErr := g.Wait(ctx, off+1)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		for off < size {
			n, err := f.ReadAt(buf[:min(int64(len(buf)), size-off)], off)
			if n > 0 {
				if _, werr := out.Write(buf[:n]); werr != nil {
					return werr
				}
				off += int64(n)
			}
			if err != nil && err != io.EOF {
				return err
			}
		}
		if done {
			return genErr
		}
	}
}

type tail struct {
	mu sync.Mutex
	b  []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > 2048 {
		t.b = t.b[len(t.b)-2048:]
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.b))
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
