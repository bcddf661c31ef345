package route

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"packwire/internal/gitexec"
	"packwire/internal/server/cluster"
)

// A replica's write of a small push is mostly the start of its two git
// processes (update-ref for the refs, rev-list for the connectivity
// check): each takes milliseconds of CPU that the primary, its client
// and the other replicas want at the same moment. So after each
// replication of a repository the node starts the next one's processes
// (a warmKit), off the push's path; they wait for their input, which
// only the next replication gives. Neither reads anything of the
// repository before that: update-ref locks and compares the refs at
// "prepare", and both open the quarantine (an alternate object
// directory, made when the replication comes) at their first object
// lookup, so a kit made before other writes sees them.

const (
	// warmDelay is how long after a replication the next kit is started:
	// after the push's own tail (the primary's commit and report, the
	// other replicas' writes), which it would otherwise compete with for
	// CPU, and well before a CI runner's next push.
	warmDelay = 20 * time.Millisecond
	// warmMaxAge drops a kit not used in that time: two idle processes
	// per repository pushed to recently, no more.
	warmMaxAge = time.Minute
	// maxWarmKits bounds the repositories with a kit on one node.
	maxWarmKits = 32
)

// proc is a started git process, reaped by its own goroutine: whether it
// is still alive can be asked without waiting.
type proc struct {
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // once exited is closed
}

func startProc(cmd *exec.Cmd) (*proc, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, exited: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.exited) }()
	return p, nil
}

func (p *proc) wait() error { <-p.exited; return p.err }

func (p *proc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// warmKit is one replication's processes, started before it comes.
type warmKit struct {
	gitDir string
	// quarantine is where the replication's pack is written
	// (objects/incoming-*, as receive-pack's quarantine): made with the
	// kit, empty until the replication comes. Making a directory (and
	// removing one) takes a few hundred microseconds on a busy disk: not
	// on the replication's path.
	quarantine string
	refs       *refTxn
	check      *proc
	checkIn    io.WriteCloser
	checkOut   *bytes.Buffer
	cancel     context.CancelFunc // kills both processes
	made       time.Time
	dirInfo    os.FileInfo // the repository directory when the kit started
}

// startKit starts a replication's processes in the repository at gitDir,
// with quarantine as its quarantine ("": a new one).
func startKit(gitDir, quarantine string) (*warmKit, error) {
	info, err := os.Stat(gitDir)
	if err != nil {
		return nil, err
	}
	if quarantine == "" {
		b := make([]byte, 8)
		rand.Read(b)
		quarantine = filepath.Join(gitDir, "objects", "incoming-"+hex.EncodeToString(b))
	}
	k := &warmKit{gitDir: gitDir, quarantine: quarantine, made: time.Now(), dirInfo: info}
	if err := os.MkdirAll(filepath.Join(k.quarantine, "pack"), 0o755); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	k.cancel = cancel
	if k.refs, err = spawnRefs(ctx, gitDir, k.quarantine); err != nil {
		os.RemoveAll(k.quarantine)
		cancel()
		return nil, err
	}
	// Every new value must be complete here (git's own check of a push):
	// the new values, then "^tip" for every ref this copy has (read when
	// the replication comes: the processes may be older than the refs).
	cmd := exec.CommandContext(ctx, "git", "-c", "safe.directory=*", "--git-dir", gitDir, "rev-list", "--objects", "--stdin", "--quiet")
	cmd.Env = append(gitexec.Environ(), "GIT_ALTERNATE_OBJECT_DIRECTORIES="+k.quarantine)
	k.checkOut = &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = k.checkOut, k.checkOut
	cmd.WaitDelay = 5 * time.Second
	if k.checkIn, err = cmd.StdinPipe(); err == nil {
		k.check, err = startProc(cmd)
	}
	if err != nil {
		k.end()
		return nil, err
	}
	return k, nil
}

// usable tells whether both processes still wait for their input, for
// the repository they started in (not another one put at its path since:
// they read its config when they started).
func (k *warmKit) usable() bool {
	info, err := os.Stat(k.gitDir)
	return err == nil && os.SameFile(info, k.dirInfo) && k.refs.proc.alive() && k.check.alive()
}

// connected checks that updates' new values are complete in this copy
// with the quarantine's objects.
func (k *warmKit) connected(updates []cluster.Update) error {
	var in strings.Builder
	for _, u := range updates {
		if !cluster.IsZero(u.New) {
			in.WriteString(u.New + "\n")
		}
	}
	if in.Len() > 0 {
		tips, err := refTips(k.gitDir)
		if err != nil {
			k.checkIn.Close()
			return err
		}
		for _, t := range tips {
			in.WriteString("^" + t + "\n")
		}
	}
	// A failed write shows as rev-list's failure.
	io.WriteString(k.checkIn, in.String())
	k.checkIn.Close()
	if err := k.check.wait(); err != nil {
		return fmt.Errorf("%v: %s", err, cluster.LastLines(k.checkOut.String(), 3))
	}
	return nil
}

// end finishes the kit whatever happened: an update-ref transaction not
// committed is aborted (the refs unchanged), the processes end, the
// quarantine goes.
func (k *warmKit) end() {
	if k.refs != nil {
		k.refs.abort()
	}
	if k.check != nil {
		k.checkIn.Close() // no input: rev-list ends at once
		k.check.wait()
	}
	k.cancel()
	if k.quarantine != "" {
		os.RemoveAll(k.quarantine)
	}
}

// finish ends a kit whose replication committed, and hands its
// quarantine, emptied by the replication, to the repository's next kit:
// making a directory, and removing one, cost a few hundred microseconds
// of CPU each on this machine's disk, which the next push wants.
// The next kit is started only then (refill), so that it gets the
// quarantine however long this kit's processes take to end.
func (k *warmKit) finish(w *warmKits) {
	q := k.quarantine
	k.quarantine = "" // end leaves it
	k.end()
	if left, err := os.ReadDir(filepath.Join(q, "pack")); err != nil || len(left) > 0 || !w.keepQuarantine(k.gitDir, q) {
		os.RemoveAll(q)
	}
	w.refill(k.gitDir)
}

// discard ends a kit never used, in the background.
func (k *warmKit) discard() {
	k.cancel()
	go k.end()
}

// warmKits holds at most one kit per repository.
type warmKits struct {
	mu     sync.Mutex
	kits   map[string]*warmKit // by git directory
	timers map[string]*time.Timer
	// quarantines are emptied quarantines, by git directory, for the
	// repository's next kit (finish).
	quarantines map[string]string
	closed      bool
	used        int // kits taken, for tests
}

// take returns the repository's kit, if one is ready, for one
// replication; nil otherwise (the caller starts one at once).
func (w *warmKits) take(gitDir string) *warmKit {
	w.mu.Lock()
	k := w.kits[gitDir]
	delete(w.kits, gitDir)
	w.mu.Unlock()
	if k == nil {
		return nil
	}
	if time.Since(k.made) > warmMaxAge || !k.usable() {
		k.discard()
		return nil
	}
	w.mu.Lock()
	w.used++
	w.mu.Unlock()
	return k
}

// refill starts the repository's next kit after warmDelay.
func (w *warmKits) refill(gitDir string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	if w.timers == nil {
		w.timers = map[string]*time.Timer{}
	}
	if t := w.timers[gitDir]; t != nil {
		t.Stop()
	}
	w.timers[gitDir] = time.AfterFunc(warmDelay, func() {
		w.mu.Lock()
		q := w.quarantines[gitDir]
		delete(w.quarantines, gitDir)
		w.mu.Unlock()
		k, err := startKit(gitDir, q)
		if err != nil {
			if q != "" {
				os.RemoveAll(q)
			}
			return // the next replication starts its own
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(w.timers, gitDir)
		if w.closed {
			k.discard()
			return
		}
		if old := w.kits[gitDir]; old != nil {
			old.discard()
		}
		w.expire()
		if len(w.kits) >= maxWarmKits {
			w.dropOldest()
		}
		if w.kits == nil {
			w.kits = map[string]*warmKit{}
		}
		w.kits[gitDir] = k
	})
}

// keepQuarantine keeps q, an empty quarantine of the repository at
// gitDir, for its next kit; false if it was not kept.
func (w *warmKits) keepQuarantine(gitDir, q string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || w.quarantines[gitDir] != "" || len(w.quarantines) >= maxWarmKits {
		return false
	}
	if w.quarantines == nil {
		w.quarantines = map[string]string{}
	}
	w.quarantines[gitDir] = q
	return true
}

// expire discards kits past warmMaxAge. Under w.mu.
func (w *warmKits) expire() {
	for dir, k := range w.kits {
		if time.Since(k.made) > warmMaxAge {
			delete(w.kits, dir)
			k.discard()
		}
	}
}

// dropOldest discards the oldest kit. Under w.mu.
func (w *warmKits) dropOldest() {
	var oldest string
	for dir, k := range w.kits {
		if oldest == "" || k.made.Before(w.kits[oldest].made) {
			oldest = dir
		}
	}
	if k := w.kits[oldest]; k != nil {
		delete(w.kits, oldest)
		k.discard()
	}
}

// close discards every kit and starts no more; it returns once their
// processes have ended.
func (w *warmKits) close() {
	w.mu.Lock()
	w.closed = true
	for _, t := range w.timers {
		t.Stop()
	}
	kits := w.kits
	w.kits = nil
	for _, q := range w.quarantines {
		os.RemoveAll(q)
	}
	w.quarantines = nil
	w.mu.Unlock()
	for _, k := range kits {
		k.cancel()
		k.end()
	}
}

// refTxn is a `git update-ref --stdin` transaction.
type refTxn struct {
	proc   *proc
	in     io.WriteCloser
	out    *bufio.Reader
	outR   *os.File
	stderr *bytes.Buffer
	done   bool
	sent   bool
	// written is closed once send's lines are written to update-ref.
	written chan struct{}
}

// spawnRefs starts update-ref, the new objects seen through the
// quarantine (not yet in the repository, nor made yet).
func spawnRefs(ctx context.Context, gitDir, quarantine string) (*refTxn, error) {
	cmd := exec.CommandContext(ctx, "git", "-c", "safe.directory=*", "--git-dir", gitDir, "update-ref", "--stdin")
	cmd.Env = append(gitexec.Environ(), "GIT_ALTERNATE_OBJECT_DIRECTORIES="+quarantine)
	// Its locks on the refs are removed, not left, when it is stopped.
	gitexec.StopGently(cmd, 5*time.Second)
	t := &refTxn{stderr: &bytes.Buffer{}, written: make(chan struct{})}
	cmd.Stderr = t.stderr
	var err error
	if t.in, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	// Its answers through a pipe of our own: exec's would be closed by
	// the reaping goroutine as soon as the process exits, maybe before
	// its last answer was read.
	r, w, err := os.Pipe()
	if err != nil {
		t.in.Close()
		return nil, err
	}
	cmd.Stdout = w
	t.proc, err = startProc(cmd)
	w.Close()
	if err != nil {
		r.Close()
		t.in.Close()
		return nil, err
	}
	t.outR, t.out = r, bufio.NewReader(r)
	return t, nil
}

// send starts the transaction of updates: written while the objects
// come (a pipe's buffer holds a usual push's lines, and a large one's
// are read by update-ref meanwhile).
func (t *refTxn) send(updates []cluster.Update) {
	var b strings.Builder
	b.WriteString("start\n")
	for _, u := range updates {
		if cluster.IsZero(u.New) {
			fmt.Fprintf(&b, "delete %s %s\n", u.Ref, u.Old)
		} else {
			fmt.Fprintf(&b, "update %s %s %s\n", u.Ref, u.New, u.Old)
		}
	}
	t.sent = true
	go func() {
		defer close(t.written)
		io.WriteString(t.in, b.String()) // a failure shows at prepare
	}()
}

// prepare locks every ref at its old value.
func (t *refTxn) prepare() error {
	<-t.written
	if _, err := io.WriteString(t.in, "prepare\n"); err != nil {
		return t.fail("prepare", err)
	}
	for _, want := range []string{"start: ok\n", "prepare: ok\n"} {
		if line, err := t.out.ReadString('\n'); err != nil || line != want {
			return t.fail("prepare", fmt.Errorf("%q: %v", line, err))
		}
	}
	return nil
}

// commit writes the prepared refs. The refs are written once update-ref
// says so; its exit is not waited for (end reaps it).
func (t *refTxn) commit() error {
	if _, err := io.WriteString(t.in, "commit\n"); err != nil {
		return t.fail("commit", err)
	}
	if line, err := t.out.ReadString('\n'); err != nil || line != "commit: ok\n" {
		return t.fail("commit", fmt.Errorf("%q: %v", line, err))
	}
	t.done = true
	t.in.Close()
	t.outR.Close()
	return nil
}

// abort ends the transaction, the refs unchanged, unless it committed or
// failed already, and waits for update-ref to exit.
func (t *refTxn) abort() {
	if !t.done {
		t.done = true
		if t.sent {
			<-t.written
			io.WriteString(t.in, "abort\n")
		}
		t.in.Close()
		t.outR.Close()
	}
	t.proc.wait()
}

func (t *refTxn) fail(step string, err error) error {
	t.done = true
	if t.sent {
		<-t.written
	}
	t.in.Close()
	t.proc.wait()
	t.outR.Close()
	if msg := strings.TrimSpace(t.stderr.String()); msg != "" {
		return fmt.Errorf("update-ref %s: %s", step, cluster.LastLines(msg, 3))
	}
	return fmt.Errorf("update-ref %s: %w", step, err)
}
