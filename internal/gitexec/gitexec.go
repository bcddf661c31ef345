// Package gitexec is the one place packwire spawns git. It starts
// upload-pack, receive-pack or upload-archive with the settings served
// repositories need, relays both directions as data arrives, kills the
// whole process group when the client goes away or the request goes idle,
// and reports what the process cost (bytes, CPU, peak RSS, wall).
package gitexec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"packwire/internal/procgroup"
)

// Service is a git server program.
type Service string

const (
	UploadPack    Service = "git-upload-pack"
	ReceivePack   Service = "git-receive-pack"
	UploadArchive Service = "git-upload-archive"
)

// ParseService accepts "git-upload-pack" or "upload-pack" (and the other two).
func ParseService(s string) (Service, bool) {
	switch strings.TrimPrefix(s, "git-") {
	case "upload-pack":
		return UploadPack, true
	case "receive-pack":
		return ReceivePack, true
	case "upload-archive":
		return UploadArchive, true
	}
	return "", false
}

// ServedConfig is passed with "git -c" to every spawn, so that served
// repositories give clients what they need without editing each repo's
// config (and so that it also applies to repositories imported as they are).
var ServedConfig = []string{
	"uploadpack.allowFilter=true",        // partial clone
	"uploadpack.allowAnySHA1InWant=true", // promisor fetches of single objects
	"receive.advertisePushOptions=true",  // git push -o
	"safe.directory=*",                   // repos are resolved and confined by packwire
	"core.logAllRefUpdates=false",        // bare: no reflogs in the request path
	// Maintenance's pack-refs locks each loose ref it packs; at load a
	// lock is held longer than git's 100 ms default, and a push to that
	// ref failed "cannot lock ref ... File exists": wait for it instead.
	"core.filesRefLockTimeout=5000",
	"uploadarchive.allowUnreachable=false", // archive only what refs reach
	// refs/packwire/ is reserved for packwire: neither listed to clients
	// nor pushable.
	"transfer.hideRefs=refs/packwire/",
	// Maintenance (internal/maintain) owns the object layout: never run
	// git's automatic gc in the request path, and keep every push as a
	// small pack that a geometric repack folds in later.
	"gc.auto=0",
	"receive.autogc=false",
	"transfer.unpackLimit=1",
	"receive.unpackLimit=1",
	// Not uploadpack.allowRefInWant: git 2.39's upload-pack then sends
	// wanted-refs before shallow-info and its own client fails a v2
	// "clone --depth" with "expected 'packfile', received 'shallow-info'".
}

// PipeSize is the capacity asked for the pipe carrying git's output; the
// kernel caps it at /proc/sys/fs/pipe-max-size (1 MiB by default). Linux
// only: elsewhere a pipe keeps the OS's own size.
var PipeSize = 1 << 20

// terminateGrace is how long an ended receive-pack may take to clean up
// before it is asked to stop, and again before it is killed.
const terminateGrace = 2 * time.Second

// ErrIdle is returned when neither side sent anything for IdleTimeout.
var ErrIdle = errors.New("idle timeout")

// ErrClientGone is returned when writing to the client failed mid-response.
var ErrClientGone = errors.New("client hung up")

// Runner spawns git. Its zero value works: "git" from PATH, no idle limit.
type Runner struct {
	GitPath     string        // default "git"
	IdleTimeout time.Duration // 0: none; kill after this long with no data either way
}

// Spec is one git invocation.
type Spec struct {
	Service       Service
	RepoPath      string   // absolute path of the bare repository
	Protocol      string   // GIT_PROTOCOL, e.g. "version=2"; empty for v0
	StatelessRPC  bool     // smart HTTP: one request, one response
	AdvertiseRefs bool     // smart HTTP info/refs
	Env           []string // extra environment, e.g. PACKWIRE_USER=...
	Config        []string // per-request "key=value" for git -c, after the served ones
	// OutputTap, if set, sees git's output before the client does. It must
	// be cheap and never fail (the classifier stops after the first section).
	OutputTap io.Writer
	// Progress, if set, counts bytes as they move, for views of running
	// requests; several runs of one request may share it.
	Progress *Progress
	// OutputFile, if set, is git's stdout itself: git writes its answer
	// straight into this (empty) file, with no relay through packwire
	// (Run's stdout and OutputTap are then unused). The idle deadline
	// watches the file's size. For answers that others read from the file.
	OutputFile *os.File
}

// Progress is the bytes a running request moved so far. Its counters are
// atomic: any goroutine may read them while the relay adds to them.
type Progress struct {
	BytesIn  atomic.Int64 // client -> git
	BytesOut atomic.Int64 // git -> client
}

// Result is what one git process did and cost.
type Result struct {
	ExitCode int
	BytesIn  int64 // client -> git
	BytesOut int64 // git -> client
	UserCPU  time.Duration
	SysCPU   time.Duration
	MaxRSS   int64 // bytes, largest process in the tree; 0: unknown (Windows)
	Wall     time.Duration
	Stderr   string // the last few KiB git wrote to stderr
}

// Args returns the git command line for spec (without the git binary).
func (r *Runner) Args(spec Spec) []string {
	args := make([]string, 0, 2*len(ServedConfig)+8)
	for _, c := range ServedConfig {
		args = append(args, "-c", c)
	}
	for _, c := range spec.Config {
		args = append(args, "-c", c)
	}
	args = append(args, strings.TrimPrefix(string(spec.Service), "git-"))
	if spec.Service != UploadArchive {
		if spec.StatelessRPC {
			args = append(args, "--stateless-rpc")
		}
		if spec.AdvertiseRefs {
			args = append(args, "--advertise-refs")
		}
	}
	if spec.Service == UploadPack {
		args = append(args, "--strict") // never fall back to PATH/.git
	}
	return append(args, spec.RepoPath)
}

// WriteDeadliner is implemented by client streams whose blocked writes can
// be cut short (net.Conn, and the HTTP and SSH transports' writers). When a
// request is killed, Run sets a deadline of now so that a write stuck on a
// client that stopped reading cannot hold the request open.
type WriteDeadliner interface {
	SetWriteDeadline(time.Time) error
}

// DeadlineOnCancel makes a read or write blocked on a stalled client
// return when ctx is done, by calling set with a deadline of now. The
// release it returns stops that and waits for a set already under way:
// set is never called after release returns, since a transport's stream
// may be invalid by then (HTTP/2's writers panic once their handler has
// returned), and a bare context.AfterFunc's stop does not wait. When ctx
// was not done, release also clears the deadline.
func DeadlineOnCancel(ctx context.Context, set func(time.Time) error) (release func()) {
	var (
		mu       sync.Mutex
		released bool
	)
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !released {
			set(time.Now())
		}
	})
	return func() {
		stopped := stop()
		mu.Lock()
		released = true
		mu.Unlock()
		if stopped {
			set(time.Time{})
		}
	}
}

// Run spawns git for spec and relays stdin to it and its stdout to stdout,
// as data arrives, until git exits. stderr may be nil; write errors on it
// are ignored (a client not reading progress must not fail a fetch).
// Cancelling ctx kills git and everything it started. No write to stdout
// or stderr happens after Run returns.
func (r *Runner) Run(ctx context.Context, spec Spec, stdin io.Reader, stdout, stderr io.Writer) (Result, error) {
	start := time.Now()
	gitPath := r.GitPath
	if gitPath == "" {
		gitPath = "git"
	}
	cmd := exec.Command(gitPath, r.Args(spec)...)
	cmd.Dir = spec.RepoPath
	cmd.Env = childEnv(spec)
	tail := &tailBuffer{max: 4096}
	if stderr != nil {
		cmd.Stderr = io.MultiWriter(tail, &bestEffortWriter{w: stderr})
	} else {
		cmd.Stderr = tail
	}
	gitIn, err := cmd.StdinPipe()
	if err != nil {
		return Result{}, err
	}
	var outR, outW *os.File
	if spec.OutputFile != nil {
		cmd.Stdout = spec.OutputFile
	} else {
		// Our own pipe rather than StdoutPipe: Wait must not close the read
		// end under the copying goroutine.
		outR, outW, err = os.Pipe()
		if err != nil {
			return Result{}, err
		}
		// A larger pipe lets git write ahead instead of waking the relay every
		// 64 KiB (the default): on two cores that ping-pong was measurable.
		if PipeSize > 0 {
			growPipe(outW, PipeSize)
		}
		cmd.Stdout = outW
	}
	// Own process group: a kill reaches pack-objects and hooks too (and on
	// Linux, if packwire dies, its git children die with it).
	if err := procgroup.Start(cmd); err != nil {
		if outR != nil {
			outR.Close()
			outW.Close()
		}
		return Result{}, fmt.Errorf("spawn git: %w", err)
	}
	if outW != nil {
		outW.Close()
	}

	var (
		bytesIn, bytesOut atomic.Int64
		lastSeen          atomic.Int64
		killMu            sync.Mutex
		killErr           error
		finished          bool
	)
	lastSeen.Store(time.Now().UnixNano())
	kill := func(why error) {
		killMu.Lock()
		defer killMu.Unlock()
		if finished || killErr != nil {
			return
		}
		killErr = why
		if spec.Service == ReceivePack {
			// A push is ended by closing its input first: index-pack stops at
			// the early EOF and receive-pack exits on its own, removing its
			// quarantine (objects/tmp_objdir-incoming-*), which a kill leaves
			// on disk (a SIGTERM to the group races index-pack's writes).
			// Asked to stop if it lingers, killed if it still does.
			gitIn.Close()
			later := func(d time.Duration, stop func(*exec.Cmd)) {
				time.AfterFunc(d, func() {
					killMu.Lock()
					defer killMu.Unlock()
					if !finished {
						stop(cmd)
					}
				})
			}
			later(terminateGrace, procgroup.Terminate)
			later(2*terminateGrace, procgroup.Kill)
		} else {
			procgroup.Kill(cmd)
		}
		if d, ok := stdout.(WriteDeadliner); ok {
			d.SetWriteDeadline(time.Now())
		}
	}

	// Client -> git. On EOF git sees EOF. Not waited for: a client may keep
	// its side open after git is done; the transport's close ends it.
	go func() {
		io.Copy(&countingWriter{w: gitIn, n: &bytesIn, seen: &lastSeen, progress: spec.Progress}, stdin)
		gitIn.Close()
	}()

	// git -> client.
	copied := make(chan struct{})
	relay := func() {
		defer close(copied)
		defer outR.Close()
		bufp := CopyBuffers.Get().(*[]byte)
		defer CopyBuffers.Put(bufp)
		buf := *bufp
		for {
			n, rerr := outR.Read(buf)
			if n > 0 {
				lastSeen.Store(time.Now().UnixNano())
				if spec.OutputTap != nil {
					spec.OutputTap.Write(buf[:n])
				}
				if _, werr := stdout.Write(buf[:n]); werr != nil {
					kill(ErrClientGone)
					io.Copy(io.Discard, outR)
					return
				}
				bytesOut.Add(int64(n))
				if spec.Progress != nil {
					spec.Progress.BytesOut.Add(int64(n))
				}
			}
			if rerr != nil {
				return
			}
		}
	}
	if outR != nil {
		go relay()
	} else {
		close(copied) // git writes into spec.OutputFile itself
	}

	done := make(chan struct{})
	go func() {
		var idle <-chan time.Time
		var lastMoved int64
		if r.IdleTimeout > 0 {
			t := time.NewTicker(min(r.IdleTimeout/4, time.Second))
			defer t.Stop()
			idle = t.C
		}
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				kill(ctx.Err())
				return
			case <-idle:
				if spec.Progress != nil {
					// Bytes the request moved besides this git's (a fetch
					// cache answer in its session, while git waits for the
					// next command) are signs of life too.
					if moved := spec.Progress.BytesIn.Load() + spec.Progress.BytesOut.Load(); moved != lastMoved {
						lastMoved = moved
						lastSeen.Store(time.Now().UnixNano())
					}
				}
				if spec.OutputFile != nil {
					// No relay sees git's output go by: its file's growth is the sign of life.
					if fi, err := spec.OutputFile.Stat(); err == nil && fi.Size() != bytesOut.Load() {
						bytesOut.Store(fi.Size())
						lastSeen.Store(time.Now().UnixNano())
					}
				}
				if time.Since(time.Unix(0, lastSeen.Load())) > r.IdleTimeout {
					kill(ErrIdle)
					return
				}
			}
		}
	}()

	<-copied
	waitErr := cmd.Wait()
	close(done)
	killMu.Lock()
	finished = true
	why := killErr
	killMu.Unlock()

	if spec.OutputFile != nil {
		if fi, err := spec.OutputFile.Stat(); err == nil {
			bytesOut.Store(fi.Size())
		}
	}
	res := Result{
		Wall:     time.Since(start),
		BytesIn:  bytesIn.Load(),
		BytesOut: bytesOut.Load(),
		Stderr:   tail.String(),
	}
	if st := cmd.ProcessState; st != nil {
		res.ExitCode = st.ExitCode()
		u := procgroup.UsageOf(st)
		res.UserCPU, res.SysCPU, res.MaxRSS = u.UserCPU, u.SysCPU, u.MaxRSS
	}
	if why != nil {
		return res, why
	}
	var exitErr *exec.ExitError
	if waitErr != nil && !errors.As(waitErr, &exitErr) {
		return res, waitErr
	}
	return res, nil
}

// StopGently makes the end of cmd's context (exec.CommandContext) ask
// git to stop with SIGTERM rather than kill it: on SIGTERM git removes
// the lock files of the ref transaction it holds, which a SIGKILL leaves
// behind, failing every later update of those refs ("Unable to create
// '....lock': File exists") until someone removes them. It is killed
// if still running after wait.
func StopGently(cmd *exec.Cmd, wait time.Duration) {
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = wait
}

// CopyBuffers are the 256 KiB buffers every copy of git's output to a
// client goes through (this relay, cache replays, the HTTP transport's
// copies), reused between requests: most requests are small
// (advertisements, negotiation rounds), and a fresh 256 KiB each would only
// feed the garbage collector. 256 KiB, not io.Copy's 32 KiB: 8x fewer
// writes and frames.
var CopyBuffers = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

// childEnv is the environment of a spawned git: Environ plus the request's own.
func childEnv(spec Spec) []string {
	env := Environ()
	if spec.Protocol != "" {
		env = append(env, "GIT_PROTOCOL="+spec.Protocol)
	}
	return append(env, spec.Env...)
}

// Environ is packwire's environment without the GIT_* variables that would
// change what git does (GIT_DIR, GIT_TRACE..., a client's GIT_PROTOCOL),
// for every git packwire runs.
func Environ() []string {
	keep := map[string]bool{"GIT_CONFIG_NOSYSTEM": true, "GIT_CONFIG_GLOBAL": true, "GIT_EXEC_PATH": true}
	env := make([]string, 0, len(os.Environ())+8)
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "GIT_") && !keep[name] {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// countingWriter counts what reaches git and when it last moved.
type countingWriter struct {
	w        io.Writer
	n        *atomic.Int64
	seen     *atomic.Int64
	progress *Progress
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.seen.Store(time.Now().UnixNano())
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	if c.progress != nil {
		c.progress.BytesIn.Add(int64(n))
	}
	return n, err
}

// bestEffortWriter passes git's stderr (progress, hook output) on and never
// fails: os/exec would otherwise report a successful git as failed when the
// client stopped reading stderr. A client that is gone shows on stdout.
type bestEffortWriter struct {
	w      io.Writer
	failed bool
}

func (b *bestEffortWriter) Write(p []byte) (int, error) {
	if !b.failed {
		if _, err := b.w.Write(p); err != nil {
			b.failed = true
		}
	}
	return len(p), nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.b))
}
