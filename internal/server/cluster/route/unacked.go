package route

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"packwire/internal/gitexec"
	"packwire/internal/repo"
	"packwire/internal/server/cluster"
)

// A replica takes a push's updates before the push is committed: the
// primary commits its generation once a majority holds them. A primary
// that dies (or is deposed) between the two leaves every copy that took
// the updates off the generation's refs, and those copies cannot prove
// they hold the generation (their refs' digest is not its digest). When
// they are all the copies left (the primary's own, the only one without
// the push, is down), no copy can be caught up from, and the repository
// takes no push until the old primary comes back: a wedge, forever if
// it never does.
//
// So a replica notes its last replication (unackedFile): the digest it
// was made from, the updates, and the digest they left. A copy whose refs
// are still that after-digest while the repository's generation has the
// before-digest holds a push that was never committed (or one being
// committed right now): with the repository's push turn held
// (cluster.HoldPushes), no push can commit, so it is the former, and
// the copy undoes it. Its refs are then the generation's, proven by
// digest, and it is recorded at the generation again. Undoing loses
// nothing: a push is acknowledged only after its commit.

// unackedFile, in a copy's git directory, is its last replication.
const unackedFile = "packwire-replication.json"

// unackedAge is how old a replication must be before a copy recorded at
// the generation takes the repository's push turn to look at it: a live
// primary commits its push within milliseconds of its majority, so only
// a push given up on is still pending after it (holding the turn for a
// live push would only wait for it).
const unackedAge = 2 * time.Second

type unacked struct {
	Before  string           `json:"before"` // the refs' digest before the updates
	After   string           `json:"after"`  // and once they were written
	Updates []cluster.Update `json:"updates"`
}

// noteUnacked records the replication just applied to gitDir (with the
// ref writes held). A replication made from an unknown digest is not
// noted (and an older note is removed: it no longer describes the refs).
func noteUnacked(gitDir, before, after string, updates []cluster.Update) error {
	path := filepath.Join(gitDir, unackedFile)
	if before == "" {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	b, err := json.Marshal(unacked{Before: before, After: after, Updates: updates})
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// readUnacked returns gitDir's last replication and when it was noted;
// ok false when there is none (or it cannot be read: nothing to undo).
func readUnacked(gitDir string) (u unacked, at time.Time, ok bool) {
	path := filepath.Join(gitDir, unackedFile)
	fi, err := os.Stat(path)
	if err != nil {
		return u, at, false
	}
	b, err := os.ReadFile(path)
	if err != nil || json.Unmarshal(b, &u) != nil || u.Before == "" || u.After == "" || len(u.Updates) == 0 {
		return u, at, false
	}
	return u, fi.ModTime(), true
}

// undoUnacked makes r's refs the generation's of pl by undoing its last
// replication, if that replication was made from the generation's refs
// and the copy's refs are still what it left. It must run with pl read
// under the repository's push turn (cluster.HoldPushes). It reports the
// copy's digest and whether it undid anything.
func (rt *Router) undoUnacked(ctx context.Context, r repo.Repo, pl cluster.Placement) (string, bool, error) {
	u, _, ok := readUnacked(r.Path)
	if !ok || pl.Digest == "" || u.Before != pl.Digest {
		return "", false, nil
	}
	writes, err := lockRefWrites(ctx, r.Path)
	if err != nil {
		return "", false, err
	}
	defer writes.Release()
	refs, err := cluster.CopyRefs(r.Path)
	if err != nil {
		return "", false, err
	}
	if cluster.RefDigest(refs) != u.After || cluster.RefDigest(cluster.Apply(refs, reverse(u.Updates))) != pl.Digest {
		return "", false, nil // the refs moved on since: not this replication's to undo
	}
	var in strings.Builder
	in.WriteString("start\n")
	for _, b := range reverse(u.Updates) {
		switch {
		case cluster.IsZero(b.New):
			fmt.Fprintf(&in, "delete %s %s\n", b.Ref, b.Old)
		case cluster.IsZero(b.Old):
			fmt.Fprintf(&in, "create %s %s\n", b.Ref, b.New)
		default:
			fmt.Fprintf(&in, "update %s %s %s\n", b.Ref, b.New, b.Old)
		}
	}
	in.WriteString("prepare\ncommit\n")
	cmd := exec.CommandContext(ctx, "git", "--git-dir", r.Path, "update-ref", "--stdin")
	gitexec.StopGently(cmd, 5*time.Second)
	cmd.Stdin = strings.NewReader(in.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", false, fmt.Errorf("undoing an unacknowledged replication: %v: %s", err, cluster.LastLines(string(out), 3))
	}
	os.Remove(filepath.Join(r.Path, unackedFile))
	digest, err := cluster.CopyDigest(r.Path)
	if err != nil {
		return "", false, err
	}
	rt.Node.Log.Warn("cluster: undid a replication whose push was never committed", "repo", pl.Repo, "generation", pl.Generation, "updates", len(u.Updates))
	return digest, true, nil
}

// undoStranded looks at this node's copies recorded at their
// repository's generation for a replication noted at least unackedAge
// ago that was made from the generation's refs and is still on the
// copy, and undoes it with the repository's pushes held (undoUnacked).
// Cheap when there is nothing to do: a small file read per copy, no git.
func (rt *Router) undoStranded(ctx context.Context) error {
	current, err := cluster.CurrentCopies(ctx, rt.Node.DB, rt.Node.Name)
	if err != nil {
		return err
	}
	// Reconcile's alone: one pass at a time. Rebuilt each pass, so a copy
	// gone leaves nothing behind.
	rt.mu.Lock()
	prev := rt.unackedSeen
	rt.mu.Unlock()
	next := map[string]string{}
	defer func() {
		rt.mu.Lock()
		rt.unackedSeen = next
		rt.mu.Unlock()
	}()
	var errs []error
	for _, c := range current {
		r, err := rt.Repos.Resolve(c.Repo)
		if err != nil {
			continue
		}
		// A note already found not to concern the generation is not read
		// again while neither changes (a stat a copy a tick).
		fi, err := os.Stat(filepath.Join(r.Path, unackedFile))
		if err != nil {
			continue
		}
		seen := fi.ModTime().String() + " " + c.Digest
		if prev[r.Path] == seen {
			next[r.Path] = seen
			continue
		}
		u, at, ok := readUnacked(r.Path)
		if time.Since(at) < unackedAge {
			continue // looked at again next tick
		}
		if !ok || c.Digest == "" || u.Before != c.Digest {
			next[r.Path] = seen
			continue
		}
		if digest, err := cluster.CopyDigest(r.Path); err != nil || digest != u.After {
			// The refs moved on (this copy's own pushes as a primary): only
			// a new replication, which writes a new note, brings it back.
			if err == nil {
				next[r.Path] = seen
			}
			continue
		}
		_, err = cluster.HoldPushes(ctx, rt.Node.DB, c.Repo, rt.Node.Name, cluster.MaxHold, rt.Node.NodeTimeout(),
			func(ctx context.Context, pl cluster.Placement) (string, error) {
				if digest, undone, err := rt.undoUnacked(ctx, r, pl); err != nil || undone {
					return digest, err
				}
				return cluster.CopyDigest(r.Path)
			})
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.Repo, err))
		}
	}
	return errors.Join(errs...)
}
