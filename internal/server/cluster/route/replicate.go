package route

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"packwire/internal/access"
	"packwire/internal/oid"
	"packwire/internal/pipeline"
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
// answer is 200 when the copy holds the update, its body "ok <digest>",
// the digest of the copy's refs read once they were written
// (cluster.CopyDigest): the primary counts it a voter only if that is
// the new generation's; 409 with git's words when
// this copy is not at the old values (nothing changed); 4xx/5xx otherwise.
const ReplicatePath = "/_packwire/replicate"

const hdrReplicaRepo = "X-Packwire-Repo"

// hdrReplicaBefore carries the digest the copy's refs must have before
// the updates (the generation the primary pushes from; absent: not
// known, not checked). Each update's old value alone does not fence a
// primary deposed mid-push: its replication, held up by a partition,
// can land after the new primary's pushes, and a ref it creates has the
// old value it claims (issue 29: it left every copy off the generation's
// refs, and no copy could be caught up from).
const hdrReplicaBefore = "X-Packwire-Before"

// ReplicateHandler serves ReplicatePath on a node: the lean write of a
// push the primary replicates here. The pack is indexed into a quarantine
// (like receive-pack's), checked for connectivity, and the refs are
// prepared in one `git update-ref --stdin` transaction with the old
// values before the quarantine's pack joins the repository and the
// transaction commits: a copy that is not at the primary's state refuses,
// and a truncated pack or a refused update leaves nothing behind.
// maxUpdates bounds the update lines of one replication: the pipeline's
// bound on a push's commands (0: pipeline.DefaultMaxPushRefs).
// Close it when the server stops: it ends the processes it started ahead
// (warm.go).
func ReplicateHandler(repos repo.Root, acc *access.Controller, maxUpdates int) *Replicator {
	if maxUpdates <= 0 {
		maxUpdates = pipeline.DefaultMaxPushRefs
	}
	return &Replicator{repos: repos, acc: acc, maxUpdates: maxUpdates, kits: &warmKits{}}
}

// Replicator is ReplicateHandler's handler.
type Replicator struct {
	repos      repo.Root
	acc        *access.Controller
	maxUpdates int
	kits       *warmKits
}

// Close ends the git processes started for replications to come.
func (h *Replicator) Close() { h.kits.close() }

func (h *Replicator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Only the cluster user: a client's token, however privileged, is
	// not asked about.
	if !fromCluster(h.acc, w, r) {
		return
	}
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	rp, err := h.repos.Resolve(r.Header.Get(hdrReplicaRepo))
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
	// digest is the copy's refs read once written: what the primary
	// compares with the generation's digest before it counts this copy.
	status, digest, err := applyReplication(ctx, rp, r.Header.Get(hdrReplicaBefore), bufio.NewReaderSize(r.Body, 64<<10), h.maxUpdates, h.kits)
	if err != nil {
		http.Error(w, oneLine(err.Error()), status)
		return
	}
	w.WriteHeader(http.StatusOK)
	io.WriteString(w, "ok "+digest+"\n")
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// applyReplication does ReplicateHandler's work on one repository and
// returns the digest of the copy's refs once written; the status is the
// HTTP answer for its error. before is the digest the
// copy's refs must have first ("": not checked).
func applyReplication(ctx context.Context, rp repo.Repo, before string, body *bufio.Reader, maxUpdates int, kits *warmKits) (int, string, error) {
	updates, err := readUpdates(body, maxUpdates)
	if err != nil {
		return http.StatusBadRequest, "", err
	}
	// The repository stays where it is meanwhile, as for a push.
	lock, err := repolock.Shared(ctx, rp.Path)
	if err != nil {
		return http.StatusNotFound, "", fmt.Errorf("repository moved or locked: %w", err)
	}
	defer lock.Release()
	// Not while this node's catch-up of the copy writes its refs
	// (refwrites.go).
	writes, err := lockRefWrites(ctx, rp.Path)
	if err != nil {
		return http.StatusServiceUnavailable, "", fmt.Errorf("waiting for the copy's catch-up: %w", err)
	}
	defer writes.Release()
	// Checked with the ref writes held: replications and catch-ups
	// (the only writers of a replica's refs) wait meanwhile.
	var refs map[string]string
	if before != "" {
		if refs, err = cluster.CopyRefs(rp.Path); err != nil {
			return http.StatusInternalServerError, "", fmt.Errorf("reading the refs before the push: %w", err)
		}
		if cluster.RefDigest(refs) != before {
			return http.StatusConflict, "", errors.New("this copy's refs are not those the push was made from (its primary was replaced, or the copy is behind); nothing was written")
		}
	}

	// update-ref and rev-list started ahead (warm.go), or now; update-ref
	// reads the updates while the objects come.
	kit := kits.take(rp.Path)
	if kit == nil {
		if kit, err = startKit(rp.Path, ""); err != nil {
			return http.StatusInternalServerError, "", err
		}
	}
	stop := context.AfterFunc(ctx, kit.cancel)
	defer stop()
	ended := false
	defer func() {
		if !ended {
			kit.end()
			kits.refill(rp.Path) // the next replication's processes
		}
	}()
	txn := kit.refs
	txn.send(updates)
	// The new objects wait in a quarantine (as receive-pack's do) until
	// the refs are prepared: made with the kit (here, a look that it is
	// still there).
	objects := filepath.Join(rp.Path, "objects")
	if err := os.MkdirAll(filepath.Join(kit.quarantine, "pack"), 0o755); err != nil {
		return http.StatusInternalServerError, "", err
	}
	if _, err := body.Peek(1); err == nil {
		if err := receivePack(body, kit.quarantine); err != nil {
			return http.StatusBadRequest, "", err
		}
	} else if !errors.Is(err, io.EOF) {
		return http.StatusBadRequest, "", err
	}
	// Every new value must be complete here (git's own check of a push),
	// checked while the refs are being prepared.
	connected := make(chan error, 1)
	go func() { connected <- kit.connected(updates) }()
	err = txn.prepare()
	cerr := <-connected
	if err != nil { // not at the old values: the first reason
		return http.StatusConflict, "", err
	}
	if cerr != nil {
		return StatusMissingObjects, "", fmt.Errorf("missing objects: %v", cerr)
	}
	if err := migrate(kit.quarantine, objects); err != nil {
		return http.StatusInternalServerError, "", err
	}
	// Kept to be undone if its push is never committed (undo.go); not
	// kept (a full disk), the copy is only not repairable that way.
	if before != "" {
		if err := keepForUndo(rp.Path, refs, before, updates); err != nil {
			os.Remove(filepath.Join(rp.Path, undoFile))
		}
	}
	if err := txn.commit(); err != nil {
		return http.StatusConflict, "", err
	}
	// Read with the ref writes still held: the answer's digest.
	after, err := cluster.CopyDigest(rp.Path)
	if err != nil {
		return http.StatusInternalServerError, "", fmt.Errorf("reading the refs after the push: %w", err)
	}
	// The refs are written: the answer need not wait for update-ref's
	// exit; the emptied quarantine serves the next replication.
	ended = true
	go kit.finish(kits)
	var created []string
	for _, u := range updates {
		if cluster.IsZero(u.Old) && strings.HasPrefix(u.Ref, "refs/heads/") {
			created = append(created, u.Ref)
		}
	}
	repo.FollowFirstPush(ctx, rp, created)
	return http.StatusOK, after, nil
}

// StatusMissingObjects answers a replication whose objects do not
// complete the new values on this copy.
const StatusMissingObjects = http.StatusUnprocessableEntity

// readUpdates reads the update lines up to the empty line.
func readUpdates(body *bufio.Reader, maxUpdates int) ([]cluster.Update, error) {
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
		if len(updates) == maxUpdates {
			return nil, errors.New("too many updates")
		}
		updates = append(updates, cluster.Update{Old: f[0], New: f[1], Ref: f[2]})
	}
	if len(updates) == 0 {
		return nil, errors.New("no updates")
	}
	return updates, nil
}
