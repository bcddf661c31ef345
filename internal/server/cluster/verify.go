package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"packwire/internal/store"
)

// CopyCheck is one replica's refs compared with its repository's
// generation's.
type CopyCheck struct {
	Node       string `json:"node"`
	Generation int64  `json:"generation"`
	Refs       int    `json:"refs"`
	Checksum   string `json:"checksum"` // its refs' digest (RefDigest), shortened
	Equal      bool   `json:"equal"`    // its refs are the generation's (the primary's if the generation's digest is not known)
	Error      string `json:"error,omitempty"`
	Repaired   bool   `json:"repaired,omitempty"` // marked stale: its node catches it up from a copy that holds the generation
}

// RepoCheck is one repository's verification.
type RepoCheck struct {
	Name       string      `json:"name"`
	Primary    string      `json:"primary"`
	Generation int64       `json:"generation"`
	Digest     string      `json:"digest"` // the generation's refs' digest, shortened ("": not known yet)
	Copies     []CopyCheck `json:"copies"`
}

// Verify reads every copy's refs through its node (as the cluster user)
// and compares their digest with the repository's generation's. With
// repair, a copy recorded at the generation whose refs are not the
// generation's is marked stale (generation -1), so that its node fetches
// everything again from a copy proven to hold the generation, deleting
// what that lacks; only when such a copy exists (its refs read now have
// the generation's digest) and the generation did not move while the
// copies were read. Verify never repairs towards a copy that is behind
// the newest generation, the primary's included. A repository whose
// generation's digest is not known yet (no push since digests came)
// is compared with its primary, and not repaired.
func Verify(ctx context.Context, db *store.DB, secret string, repos []string, repair bool, timeout time.Duration) ([]RepoCheck, error) {
	if db.Engine != store.Postgres {
		return nil, ErrNotClustered
	}
	if len(repos) == 0 {
		st, err := ReadStatus(ctx, db, timeout)
		if err != nil {
			return nil, err
		}
		for _, r := range st.Repos {
			repos = append(repos, r.Name)
		}
	}
	var out []RepoCheck
	for _, name := range repos {
		rc, err := verifyRepo(ctx, db, secret, name, repair, timeout)
		if err != nil {
			return out, err
		}
		out = append(out, rc)
	}
	return out, nil
}

func verifyRepo(ctx context.Context, db *store.DB, secret, name string, repair bool, timeout time.Duration) (RepoCheck, error) {
	for attempt := 0; ; attempt++ {
		pl, err := Locate(ctx, db, name, timeout)
		if err != nil {
			return RepoCheck{}, err
		}
		rc := RepoCheck{Name: name, Primary: pl.Primary, Generation: pl.Generation, Digest: ShortDigest(pl.Digest)}
		want := pl.Digest
		digests := map[string]string{}
		for _, r := range pl.Replicas {
			c := CopyCheck{Node: r.Node, Generation: r.Generation}
			refs, err := lsRemote(ctx, RepoURL(r.URL, name), secret)
			if err != nil {
				c.Error = err.Error()
			} else {
				digests[r.Node] = RefDigest(refs)
				c.Refs, c.Checksum = len(refs), ShortDigest(digests[r.Node])
			}
			rc.Copies = append(rc.Copies, c)
		}
		if want == "" {
			want = digests[pl.Primary]
		}
		proven := false // a copy at the generation holds its refs: a source to repair from
		for i, c := range rc.Copies {
			got, listed := digests[c.Node]
			rc.Copies[i].Equal = listed && want != "" && got == want
			proven = proven || rc.Copies[i].Equal && c.Generation == pl.Generation
		}
		if !repair || pl.Digest == "" || !proven {
			return rc, nil
		}
		// Only copies recorded at the generation without its refs are
		// repaired (the others are behind, and catch up anyway), and only
		// if nothing moved while they were read: a push between its
		// replication and its commit shows refs ahead of the generation.
		var wrong []int
		for i, c := range rc.Copies {
			if c.Error == "" && !c.Equal && c.Generation == pl.Generation {
				wrong = append(wrong, i)
			}
		}
		if len(wrong) == 0 {
			return rc, nil
		}
		again, err := Locate(ctx, db, name, timeout)
		if err != nil {
			return rc, err
		}
		if again.Generation != pl.Generation || again.Epoch != pl.Epoch {
			if attempt < 3 {
				continue
			}
			return rc, nil // kept moving: compared, not repaired
		}
		for _, i := range wrong {
			c := &rc.Copies[i]
			res, err := db.ExecContext(ctx, `UPDATE replicas SET generation = -1 WHERE repo = ? AND node = ? AND generation = ?
				AND EXISTS (SELECT 1 FROM cluster_repos WHERE name = ? AND generation = ?)`, name, c.Node, c.Generation, name, pl.Generation)
			if err != nil {
				return rc, err
			}
			if k, _ := res.RowsAffected(); k == 1 {
				c.Repaired = true
			}
		}
		return rc, nil
	}
}

// RemoteDigest is the digest of the refs a copy serves at url (read as
// the cluster user, with secret), and how many there are.
func RemoteDigest(ctx context.Context, url, secret string) (string, int, error) {
	refs, err := lsRemote(ctx, url, secret)
	if err != nil {
		return "", 0, err
	}
	return RefDigest(refs), len(refs), nil
}

// lsRemote lists a copy's refs under refs/ (not the nodes' own, which
// are hidden anyway; not the peeled "^{}" lines): ref -> id.
func lsRemote(ctx context.Context, url, secret string) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "git", "ls-remote", url, "refs/*")
	cmd.Env = append(os.Environ(), AuthEnv(secret)...)
	// Killed, git leaves its remote helper reading from a node that says
	// nothing (paused, cut off) with our pipe open: not waited for.
	cmd.WaitDelay = 2 * time.Second
	b, err := cmd.Output()
	if err != nil {
		msg := err.Error()
		if ee, ok := err.(*exec.ExitError); ok {
			msg = LastLines(string(ee.Stderr), 2)
		}
		return nil, fmt.Errorf("ls-remote: %s", msg)
	}
	refs := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if f := strings.Fields(line); len(f) == 2 && !strings.HasPrefix(f[1], LocalRefs) && !strings.HasSuffix(f[1], "^{}") {
			refs[f[1]] = f[0]
		}
	}
	return refs, nil
}
