package route

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"packwire/internal/server/cluster"
)

// TestUndoLastReplication: a replication its primary never committed
// (the primary paused or killed after its replicas took it) is undone on
// a copy when the generation is the one it was made from, moved refs and
// created ones alike; the copy then has exactly the generation's refs.
// Nothing is undone twice, nor towards another digest, nor once the
// copy's refs moved since (bench/chaos pause-primary: every copy held
// such a push, and no copy could be proven to hold the generation).
func TestUndoLastReplication(t *testing.T) {
	ctx := context.Background()
	r := newReplication(t)
	primary := filepath.Join(r.work, ".git")
	c1 := r.commit("")
	if err := r.send(cluster.Update{Old: zero, New: c1, Ref: "refs/heads/main"}); err != nil {
		t.Fatal(err)
	}
	generation, err := cluster.CopyDigest(primary)
	if err != nil {
		t.Fatal(err)
	}
	other := cluster.RefDigest(map[string]string{"refs/heads/other": c1})
	if _, err := undoLastReplication(ctx, r.replica.Path, other); !errors.Is(err, errNothingToUndo) {
		t.Fatalf("undo towards a digest the replication was not made from: %v, want errNothingToUndo", err)
	}
	before := r.refs(r.replica.Path)

	// The push the replica took and its primary never committed: main
	// moved, a branch created.
	c2 := r.commit(c1)
	if err := r.send(cluster.Update{Old: c1, New: c2, Ref: "refs/heads/main"}, cluster.Update{Old: zero, New: c2, Ref: "refs/heads/x"}); err != nil {
		t.Fatal(err)
	}
	r.env.Git(r.work, "update-ref", "refs/heads/main", c1)
	r.env.Git(r.work, "update-ref", "-d", "refs/heads/x")
	got, err := undoLastReplication(ctx, r.replica.Path, generation)
	if err != nil || got != generation {
		t.Fatalf("undo: digest %q, %v; want the generation's %q", got, err, generation)
	}
	if after := r.refs(r.replica.Path); after != before {
		t.Fatalf("refs after the undo:\n%s\nwant the generation's:\n%s", after, before)
	}
	r.same()
	if _, err := undoLastReplication(ctx, r.replica.Path, generation); !errors.Is(err, errNothingToUndo) {
		t.Fatalf("a second undo: %v, want errNothingToUndo", err)
	}

	// Taken again, then the copy's refs moved otherwise (a catch-up):
	// the replication is no longer what they are the result of.
	if err := r.send(cluster.Update{Old: zero, New: c2, Ref: "refs/heads/y"}); err != nil {
		t.Fatal(err)
	}
	r.env.Git(r.replica.Path, "update-ref", "refs/heads/z", c1)
	moved := r.refs(r.replica.Path)
	if _, err := undoLastReplication(ctx, r.replica.Path, generation); !errors.Is(err, errNothingToUndo) {
		t.Fatalf("undo after the refs moved: %v, want errNothingToUndo", err)
	}
	if after := r.refs(r.replica.Path); after != moved {
		t.Fatalf("a refused undo changed the refs:\n%s\nwas:\n%s", after, moved)
	}
}
