package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"time"

	"packwire/internal/store"
)

// CopyCheck is one replica's refs compared with the primary's.
type CopyCheck struct {
	Node       string `json:"node"`
	Generation int64  `json:"generation"`
	Refs       int    `json:"refs"`
	Checksum   string `json:"checksum"` // sha256 of its sorted "id ref" lines, refs/ only
	Equal      bool   `json:"equal"`    // same refs as the primary
	Error      string `json:"error,omitempty"`
	Repaired   bool   `json:"repaired,omitempty"` // marked stale: its node catches it up from the primary
}

// RepoCheck is one repository's verification.
type RepoCheck struct {
	Name    string      `json:"name"`
	Primary string      `json:"primary"`
	Copies  []CopyCheck `json:"copies"`
}

// Verify reads every replica's refs through its node (as the cluster
// user) and compares them with the primary's. A replica that differs but
// is recorded up to date is marked stale (generation -1 when repair is
// set), so that its node fetches everything from the primary again,
// deleting what the primary lacks.
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
		pl, err := Locate(ctx, db, name, timeout)
		if err != nil {
			return out, err
		}
		rc := RepoCheck{Name: name, Primary: pl.Primary}
		var primarySum string
		sums := map[string]CopyCheck{}
		for _, r := range pl.Replicas {
			c := CopyCheck{Node: r.Node, Generation: r.Generation}
			refs, err := lsRemote(ctx, RepoURL(r.URL, name), secret)
			if err != nil {
				c.Error = err.Error()
			} else {
				c.Refs, c.Checksum = len(refs), checksum(refs)
			}
			if r.Node == pl.Primary {
				primarySum = c.Checksum
			}
			sums[r.Node] = c
		}
		for _, r := range pl.Replicas {
			c := sums[r.Node]
			c.Equal = c.Error == "" && primarySum != "" && c.Checksum == primarySum
			if !c.Equal && repair && r.Node != pl.Primary && primarySum != "" {
				if _, err := db.ExecContext(ctx, "UPDATE replicas SET generation = -1 WHERE repo = ? AND node = ?", name, r.Node); err != nil {
					return out, err
				}
				c.Repaired = true
			}
			rc.Copies = append(rc.Copies, c)
		}
		out = append(out, rc)
	}
	return out, nil
}

// lsRemote lists a copy's refs under refs/ (not the nodes' own).
func lsRemote(ctx context.Context, url, secret string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "git", "ls-remote", url, "refs/*")
	cmd.Env = append(os.Environ(), AuthEnv(secret)...)
	b, err := cmd.Output()
	if err != nil {
		msg := err.Error()
		if ee, ok := err.(*exec.ExitError); ok {
			msg = LastLines(string(ee.Stderr), 2)
		}
		return nil, fmt.Errorf("ls-remote: %s", msg)
	}
	var refs []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if f := strings.Fields(line); len(f) == 2 && !strings.HasPrefix(f[1], LocalRefs) {
			refs = append(refs, f[0]+" "+f[1])
		}
	}
	sort.Strings(refs)
	return refs, nil
}

func checksum(refs []string) string {
	h := sha256.New()
	for _, r := range refs {
		h.Write([]byte(r + "\n"))
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}
