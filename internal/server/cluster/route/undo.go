package route

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"packwire/internal/gitexec"
	"packwire/internal/server/cluster"
)

// A primary paused or killed between its replicas taking a push and its
// commit leaves them holding a push that was never acknowledged: their
// refs are the generation's and one more update, recorded at the
// generation. Once it is failed over, no copy can be proven to hold the
// generation (the old primary's, the only one, is stopped), so the new
// primary refuses every push and no copy can catch up until the old one
// comes back and sets them back, or for good if it does not (bench/chaos
// pause-primary: "no copy proven to hold generation 3"). So each copy
// keeps the last replication it applied (its updates and the digests of
// its refs before and after) in undoFile, and undoes it when the
// repository's generation is the one it was made from: the replication
// was not committed, and with the repository's push turn taken since
// (a failover, a push or a catch-up's hold) it never will be. The result
// counts only if its refs then have the generation's digest.
const undoFile = "packwire-last-replication"

// lastReplication is what undoFile holds.
type lastReplication struct {
	before, after string // digests of the copy's refs
	updates       []cluster.Update
}

// keepForUndo writes the replication about to be committed on the copy
// at gitDir (refs are its refs before). A replication whose commit then
// fails leaves a file whose after digest the refs do not have: never
// undone.
func keepForUndo(gitDir string, refs map[string]string, before string, updates []cluster.Update) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s\n", before, cluster.RefDigest(cluster.Apply(refs, updates)))
	b.WriteString(updateLines(updates))
	tmp := filepath.Join(gitDir, undoFile+".tmp")
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(gitDir, undoFile))
}

func readLastReplication(gitDir string) (lastReplication, error) {
	f, err := os.Open(filepath.Join(gitDir, undoFile))
	if err != nil {
		return lastReplication{}, err
	}
	defer f.Close()
	r := bufio.NewReader(f)
	head, err := r.ReadString('\n')
	if err != nil {
		return lastReplication{}, err
	}
	var last lastReplication
	if _, err := fmt.Sscanf(head, "%s %s\n", &last.before, &last.after); err != nil {
		return lastReplication{}, fmt.Errorf("%s: %w", undoFile, err)
	}
	if last.updates, err = readUpdates(r, 1<<20); err != nil {
		return lastReplication{}, fmt.Errorf("%s: %w", undoFile, err)
	}
	return last, nil
}

// errNothingToUndo: the copy's last replication is not one that takes
// its refs back to the digest asked for.
var errNothingToUndo = errors.New("no replication to undo")

// undoLastReplication takes the copy at gitDir back to the refs with
// digest want by undoing its last replication, if that was made from
// them and the refs are still those it left; it returns the digest of
// the refs read after. The caller holds the copy's ref writes
// (lockRefWrites) and the repository's push turn, taken after the
// replication's (so it can no longer be committed), with want the
// digest of the generation the repository is at.
func undoLastReplication(ctx context.Context, gitDir, want string) (string, error) {
	last, err := readLastReplication(gitDir)
	if errors.Is(err, os.ErrNotExist) {
		return "", errNothingToUndo
	}
	if err != nil {
		return "", err
	}
	refs, err := cluster.CopyRefs(gitDir)
	if err != nil {
		return "", err
	}
	back := reverse(last.updates)
	if want == "" || last.before != want || cluster.RefDigest(refs) != last.after || cluster.RefDigest(cluster.Apply(refs, back)) != want {
		return "", errNothingToUndo
	}
	// The old values are back in the refs: complete here, as they were
	// before the replication (maintenance prunes no object that young).
	var olds []string
	for _, u := range back {
		if !cluster.IsZero(u.New) {
			olds = append(olds, u.New)
		}
	}
	if len(olds) > 0 {
		var in strings.Builder
		for _, id := range olds {
			in.WriteString(id + "\n")
		}
		for _, id := range refs {
			in.WriteString("^" + id + "\n")
		}
		check := exec.CommandContext(ctx, "git", "--git-dir", gitDir, "rev-list", "--objects", "--quiet", "--stdin")
		check.Env = gitexec.Environ()
		check.Stdin = strings.NewReader(in.String())
		if out, err := check.CombinedOutput(); err != nil {
			return "", fmt.Errorf("the old values of the replication to undo are not complete here: %v: %s", err, cluster.LastLines(string(out), 3))
		}
	}
	var in strings.Builder
	for _, u := range back {
		fmt.Fprintf(&in, "update %s %s %s\n", u.Ref, u.New, u.Old) // a zero new value deletes
	}
	cmd := exec.CommandContext(ctx, "git", "--git-dir", gitDir, "update-ref", "--stdin")
	cmd.Env = gitexec.Environ()
	cmd.Stdin = strings.NewReader(in.String())
	gitexec.StopGently(cmd, 5*time.Second) // it leaves no ref locks
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("undoing the last replication: %v: %s", err, cluster.LastLines(string(out), 3))
	}
	os.Remove(filepath.Join(gitDir, undoFile))
	return cluster.CopyDigest(gitDir)
}
