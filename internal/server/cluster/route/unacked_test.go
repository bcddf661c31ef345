package route

import (
	"context"
	"errors"
	"testing"

	"packwire/internal/server/cluster"
)

// TestUndoUnackedReplication (beside TestUndoLastReplication): a deleted
// ref is restored, a tag included, and a push that was committed (the
// generation's digest is the push's) is not undone.
func TestUndoUnackedReplication(t *testing.T) {
	r := newReplication(t)
	ctx := context.Background()
	c1 := r.commit("")
	if err := r.send(cluster.Update{Old: zero, New: c1, Ref: "refs/heads/main"}, cluster.Update{Old: zero, New: c1, Ref: "refs/tags/v1"}); err != nil {
		t.Fatal(err)
	}
	atGen := r.refs(r.replica.Path)
	genDigest, _ := cluster.CopyDigest(r.replica.Path)

	// The push the primary never committed.
	c2 := r.commit(c1)
	if err := r.send(cluster.Update{Old: c1, New: c2, Ref: "refs/heads/main"}, cluster.Update{Old: zero, New: c2, Ref: "refs/heads/lost"},
		cluster.Update{Old: c1, New: zero, Ref: "refs/tags/v1"}); err != nil {
		t.Fatal(err)
	}
	pushed, _ := cluster.CopyDigest(r.replica.Path)
	// Committed after all: the generation is the push's; nothing undone.
	if _, err := undoLastReplication(ctx, r.replica.Path, pushed); !errors.Is(err, errNothingToUndo) {
		t.Fatalf("a committed push undone: %v", err)
	}
	digest, err := undoLastReplication(ctx, r.replica.Path, genDigest)
	if err != nil {
		t.Fatalf("the unacknowledged push not undone: %v", err)
	}
	if got := r.refs(r.replica.Path); got != atGen || digest != genDigest {
		t.Fatalf("after undoing, the replica's refs (digest %s, want %s):\n%s\nwant:\n%s", digest, genDigest, got, atGen)
	}
	r.env.Fsck(r.replica.Path)
	r.env.Git(r.work, "update-ref", "refs/heads/main", c1)
	r.env.Git(r.work, "update-ref", "-d", "refs/heads/lost")
	r.env.Git(r.work, "update-ref", "refs/tags/v1", c1)
	r.same()
}
