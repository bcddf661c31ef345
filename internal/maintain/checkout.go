package maintain

import (
	"context"
	"fmt"
	"strings"

	"packwire/internal/oid"
)

// Checkout is how the objects of HEAD's tree (what every checkout reads,
// and all that a shallow or blobless clone's checkout fetches) are stored.
type Checkout struct {
	Objects int64 // trees and blobs of HEAD's tree, the tree itself included
	Deltas  int64 // stored as deltas
	// Outside counts deltas whose base is not in HEAD's tree: to send one
	// to a client that lacks the base, pack-objects must rebuild the
	// object and compress it again. The delta island keeps this near 0.
	Outside int64
}

// ReadCheckout looks at how HEAD's tree is stored (for repo show): one
// ls-tree and one cat-file --batch-check, a fraction of a second for a
// checkout of tens of thousands of files. An unborn HEAD has an empty
// Checkout.
func (m *Maintainer) ReadCheckout(ctx context.Context, dir string) (Checkout, error) {
	s := &session{m: m, dir: dir}
	root, err := s.git(ctx, nil, "rev-parse", "--verify", "-q", "HEAD^{tree}")
	if root = strings.TrimSpace(root); err != nil || !oid.Valid(root) {
		return Checkout{}, nil
	}
	list, err := s.git(ctx, nil, "ls-tree", "-r", "-t", "-z", "--full-tree", root)
	if err != nil {
		return Checkout{}, err
	}
	inTree := map[string]bool{root: true}
	ids := []string{root}
	for _, entry := range strings.Split(list, "\x00") {
		// "<mode> SP <type> SP <object> TAB <path>"; a submodule's commit is not stored here.
		meta, _, _ := strings.Cut(entry, "\t")
		f := strings.Fields(meta)
		if len(f) != 3 || f[1] == "commit" || !oid.Valid(f[2]) || inTree[f[2]] {
			continue
		}
		inTree[f[2]] = true
		ids = append(ids, f[2])
	}
	out, err := s.git(ctx, strings.NewReader(strings.Join(ids, "\n")+"\n"),
		"cat-file", "--batch-check=%(objectname) %(deltabase)")
	if err != nil {
		return Checkout{}, err
	}
	c := Checkout{Objects: int64(len(ids))}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 || !oid.Valid(f[0]) {
			return Checkout{}, fmt.Errorf("unexpected line from cat-file: %q", line)
		}
		if f[1] == "missing" || strings.Trim(f[1], "0") == "" {
			continue // not here (a broken repository), or stored whole
		}
		c.Deltas++
		if !inTree[f[1]] {
			c.Outside++
		}
	}
	return c, nil
}
