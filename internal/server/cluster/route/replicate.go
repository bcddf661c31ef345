package route

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"packwire/internal/access"
	"packwire/internal/gitexec"
	"packwire/internal/oid"
	"packwire/internal/repo"
	"packwire/internal/repolock"
	"packwire/internal/server/cluster"
)

// ReplicatePath is the endpoint on every node's HTTP listener that takes
// a push's replication from the repository's primary: the ref updates
// (each with its old value) and one pack of the new objects, applied as
// one transaction. Only the cluster user may call it.
//
// The body is the updates, one "<old> <new> <ref>" line each, an empty
// line, then the pack (nothing when the push brings no object). The
// answer is 200 when the copy holds the update; 409 with git's words when
// this copy is not at the old values (nothing changed); 4xx/5xx otherwise.
const ReplicatePath = "/_packwire/replicate"

const hdrReplicaRepo = "X-Packwire-Repo"

// maxReplicateUpdates bounds the update lines of one replication (the
// pipeline's own bound on a push's commands).
const maxReplicateUpdates = 100_000

// ReplicateHandler serves ReplicatePath on a node: the lean write of a
// push the primary replicates here. The pack is indexed into a quarantine
// (like receive-pack's), checked for connectivity, and the refs are
// prepared in one `git update-ref --stdin` transaction with the old
// values before the quarantine's pack joins the repository and the
// transaction commits: a copy that is not at the primary's state refuses,
// and a truncated pack or a refused update leaves nothing behind.
func ReplicateHandler(repos repo.Root, acc *access.Controller) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Only the cluster user: a client's token, however privileged, is
		// not asked about.
		user, pass, ok := r.BasicAuth()
		if !ok || user != access.ClusterUser {
			w.Header().Set("WWW-Authenticate", `Basic realm="packwire cluster"`)
			http.Error(w, "cluster credentials required", http.StatusUnauthorized)
			return
		}
		if principal, err := acc.PrincipalForToken(r.Context(), user, pass); err != nil || !principal.IsCluster() {
			http.Error(w, "cluster credentials required", http.StatusUnauthorized)
			return
		}
		if r.Method != http.MethodPost {
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		rp, err := repos.Resolve(r.Header.Get(hdrReplicaRepo))
		if err != nil {
			http.Error(w, "repository not found on this node", http.StatusNotFound)
			return
		}
		// A sender that trickles or never ends holds the repository's lock,
		// an update-ref and a quarantine: the whole replication is bounded
		// as the primary's own wait for it is.
		ctx, cancel := context.WithTimeout(r.Context(), cluster.ReplicateTimeout)
		defer cancel()
		http.NewResponseController(w).SetReadDeadline(time.Now().Add(cluster.ReplicateTimeout))
		status, err := applyReplication(ctx, rp, bufio.NewReaderSize(r.Body, 64<<10))
		if err != nil {
			http.Error(w, oneLine(err.Error()), status)
			return
		}
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "ok\n")
	})
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// applyReplication does ReplicateHandler's work on one repository; the
// status is the HTTP answer for its error.
func applyReplication(ctx context.Context, rp repo.Repo, body *bufio.Reader) (int, error) {
	updates, err := readUpdates(body)
	if err != nil {
		return http.StatusBadRequest, err
	}
	// The repository stays where it is meanwhile, as for a push.
	lock, err := repolock.Shared(ctx, rp.Path)
	if err != nil {
		return http.StatusNotFound, fmt.Errorf("repository moved or locked: %w", err)
	}
	defer lock.Release()

	// The new objects wait in a quarantine (as receive-pack's do) until
	// the refs are prepared; update-ref starts at once, while they come.
	objects := filepath.Join(rp.Path, "objects")
	quarantine, err := os.MkdirTemp(objects, "incoming-")
	if err != nil {
		return http.StatusInternalServerError, err
	}
	defer os.RemoveAll(quarantine)
	if err := os.Mkdir(filepath.Join(quarantine, "pack"), 0o755); err != nil {
		return http.StatusInternalServerError, err
	}
	qenv := []string{"GIT_OBJECT_DIRECTORY=" + quarantine, "GIT_ALTERNATE_OBJECT_DIRECTORIES=" + objects, "GIT_QUARANTINE_PATH=" + quarantine}
	txn, err := startRefs(ctx, rp, quarantine, updates)
	if err != nil {
		return http.StatusInternalServerError, err
	}
	defer txn.abort() // after commit, nothing
	if _, err := body.Peek(1); err == nil {
		if err := receivePack(body, quarantine); err != nil {
			return http.StatusBadRequest, err
		}
	} else if !errors.Is(err, io.EOF) {
		return http.StatusBadRequest, err
	}
	// Every new value must be complete here (git's own check of a push),
	// checked while the refs are being prepared.
	var wants bytes.Buffer
	for _, u := range updates {
		if !cluster.IsZero(u.New) {
			fmt.Fprintln(&wants, u.New)
		}
	}
	var connected chan error
	if wants.Len() > 0 {
		connected = make(chan error, 1)
		go func() {
			out, err := gitIn(ctx, rp, qenv, &wants, "rev-list", "--objects", "--stdin", "--not", "--all", "--quiet")
			if err != nil {
				err = fmt.Errorf("%v: %s", err, out)
			}
			connected <- err
		}()
	}
	err = txn.prepare()
	var cerr error
	if connected != nil {
		cerr = <-connected
	}
	if err != nil { // not at the old values: the first reason
		return http.StatusConflict, err
	}
	if cerr != nil {
		return StatusMissingObjects, fmt.Errorf("missing objects: %v", cerr)
	}
	if err := migrate(quarantine, objects); err != nil {
		return http.StatusInternalServerError, err
	}
	if err := txn.commit(); err != nil {
		return http.StatusConflict, err
	}
	var created []string
	for _, u := range updates {
		if cluster.IsZero(u.Old) && strings.HasPrefix(u.Ref, "refs/heads/") {
			created = append(created, u.Ref)
		}
	}
	repo.FollowFirstPush(ctx, rp, created)
	return http.StatusOK, nil
}

// StatusMissingObjects answers a replication whose objects do not
// complete the new values on this copy.
const StatusMissingObjects = http.StatusUnprocessableEntity

// readUpdates reads the update lines up to the empty line.
func readUpdates(body *bufio.Reader) ([]cluster.Update, error) {
	var updates []cluster.Update
	for {
		// ReadSlice: a line longer than the reader's buffer (64 KiB) is
		// an error, not a growing allocation.
		raw, err := body.ReadSlice('\n')
		if err != nil {
			return nil, fmt.Errorf("reading the updates: %w", err)
		}
		line := strings.TrimSuffix(string(raw), "\n")
		if line == "" {
			break
		}
		f := strings.Split(line, " ")
		if len(f) != 3 || !oid.Valid(f[0]) || !oid.Valid(f[1]) || !strings.HasPrefix(f[2], "refs/") || strings.HasPrefix(f[2], cluster.LocalRefs) {
			return nil, fmt.Errorf("bad update line %q", line)
		}
		if len(updates) == maxReplicateUpdates {
			return nil, errors.New("too many updates")
		}
		updates = append(updates, cluster.Update{Old: f[0], New: f[1], Ref: f[2]})
	}
	if len(updates) == 0 {
		return nil, errors.New("no updates")
	}
	return updates, nil
}

// refTxn is a `git update-ref --stdin` transaction.
type refTxn struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Reader
	stderr *bytes.Buffer
	done   bool
	// written is closed once the updates are written to update-ref.
	written chan struct{}
}

// startRefs starts the transaction of updates: update-ref runs and has
// read them; prepare locks the refs at their old values, the new objects
// seen through the quarantine (not yet in the repository).
func startRefs(ctx context.Context, rp repo.Repo, quarantine string, updates []cluster.Update) (*refTxn, error) {
	cmd := exec.CommandContext(ctx, "git", "-c", "safe.directory=*", "--git-dir", rp.Path, "update-ref", "--stdin")
	cmd.Env = append(gitexec.Environ(), "GIT_ALTERNATE_OBJECT_DIRECTORIES="+quarantine)
	t := &refTxn{cmd: cmd, stderr: &bytes.Buffer{}, written: make(chan struct{})}
	cmd.Stderr = t.stderr
	var err error
	if t.in, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	t.out = bufio.NewReader(outPipe)
	var b strings.Builder
	b.WriteString("start\n")
	for _, u := range updates {
		if cluster.IsZero(u.New) {
			fmt.Fprintf(&b, "delete %s %s\n", u.Ref, u.Old)
		} else {
			fmt.Fprintf(&b, "update %s %s %s\n", u.Ref, u.New, u.Old)
		}
	}
	// Written while the objects come: a pipe's buffer holds a usual
	// push's lines, and a large one's are read as update-ref starts.
	go func() {
		defer close(t.written)
		io.WriteString(t.in, b.String()) // a failure shows at prepare
	}()
	return t, nil
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

// commit writes the prepared refs.
func (t *refTxn) commit() error {
	if _, err := io.WriteString(t.in, "commit\n"); err != nil {
		return t.fail("commit", err)
	}
	if line, err := t.out.ReadString('\n'); err != nil || line != "commit: ok\n" {
		return t.fail("commit", fmt.Errorf("%q: %v", line, err))
	}
	t.done = true
	t.in.Close()
	if err := t.cmd.Wait(); err != nil {
		return fmt.Errorf("update-ref: %v: %s", err, cluster.LastLines(t.stderr.String(), 3))
	}
	return nil
}

// abort ends the transaction, the refs unchanged, unless it committed or
// failed already.
func (t *refTxn) abort() {
	if t.done {
		return
	}
	t.done = true
	<-t.written
	io.WriteString(t.in, "abort\n")
	t.in.Close()
	t.cmd.Wait()
}

func (t *refTxn) fail(step string, err error) error {
	t.done = true
	<-t.written
	t.in.Close()
	t.cmd.Wait()
	if msg := strings.TrimSpace(t.stderr.String()); msg != "" {
		return fmt.Errorf("update-ref %s: %s", step, cluster.LastLines(msg, 3))
	}
	return fmt.Errorf("update-ref %s: %w", step, err)
}

// gitIn runs git in rp with extra environment and stdin; its output is
// for an error message.
func gitIn(ctx context.Context, rp repo.Repo, env []string, stdin io.Reader, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", append([]string{"-c", "safe.directory=*", "--git-dir", rp.Path}, args...)...)
	cmd.Env = append(gitexec.Environ(), env...)
	cmd.Stdin = stdin
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	return cluster.LastLines(out.String(), 3), err
}
