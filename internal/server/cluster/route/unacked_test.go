package route

import (
	"context"
	"log/slog"
	"testing"

	"packwire/internal/server/cluster"
)

// TestUndoUnackedReplication: a replica that took a push its primary
// never committed (the primary died between its majority and its commit)
// undoes it when the generation's digest is the one the push was made
// from: its refs are then exactly the generation's again, a created ref
// deleted, an updated one put back, a deleted one restored. It undoes
// nothing when the push was committed (the generation's digest is the
// push's), when its refs moved on since, or when there is no note.
func TestUndoUnackedReplication(t *testing.T) {
	r := newReplication(t)
	r.rt.Node = &cluster.Node{Name: "b", Log: slog.New(slog.DiscardHandler)}
	ctx := context.Background()
	c1 := r.commit("")
	if err := r.send(cluster.Update{Old: zero, New: c1, Ref: "refs/heads/main"}, cluster.Update{Old: zero, New: c1, Ref: "refs/tags/v1"}); err != nil {
		t.Fatal(err)
	}
	atGen := r.refs(r.replica.Path)
	genDigest, _ := cluster.CopyDigest(r.replica.Path)
	pl := cluster.Placement{Repo: "app", Generation: 7, Digest: genDigest}

	// No note of a push since: nothing to undo.
	if _, undone, err := r.rt.undoUnacked(ctx, r.replica, cluster.Placement{Repo: "app", Generation: 6, Digest: "other"}); err != nil || undone {
		t.Fatalf("undone %v (%v) with the generation's digest not the last push's", undone, err)
	}

	// The push the primary never committed.
	c2 := r.commit(c1)
	if err := r.send(cluster.Update{Old: c1, New: c2, Ref: "refs/heads/main"}, cluster.Update{Old: zero, New: c2, Ref: "refs/heads/lost"},
		cluster.Update{Old: c1, New: zero, Ref: "refs/tags/v1"}); err != nil {
		t.Fatal(err)
	}
	pushed, _ := cluster.CopyDigest(r.replica.Path)
	// Committed after all: the generation is the push's; nothing undone.
	if _, undone, err := r.rt.undoUnacked(ctx, r.replica, cluster.Placement{Repo: "app", Generation: 8, Digest: pushed}); err != nil || undone {
		t.Fatalf("a committed push undone: %v %v", undone, err)
	}
	digest, undone, err := r.rt.undoUnacked(ctx, r.replica, pl)
	if err != nil || !undone {
		t.Fatalf("the unacknowledged push not undone: %v %v", undone, err)
	}
	if got := r.refs(r.replica.Path); got != atGen || digest != genDigest {
		t.Fatalf("after undoing, the replica's refs (digest %s, want %s):\n%s\nwant:\n%s", digest, genDigest, got, atGen)
	}
	r.env.Fsck(r.replica.Path)
	// Done once: the note is gone.
	if _, undone, _ := r.rt.undoUnacked(ctx, r.replica, pl); undone {
		t.Fatal("undone twice")
	}

	// Refs that moved on after the push (a later replication): the note
	// is the later one's, made from other refs; nothing undone.
	r.env.Git(r.work, "update-ref", "refs/heads/main", c1)
	r.env.Git(r.work, "update-ref", "-d", "refs/heads/lost")
	r.env.Git(r.work, "update-ref", "refs/tags/v1", c1)
	if err := r.send(cluster.Update{Old: c1, New: c2, Ref: "refs/heads/main"}); err != nil {
		t.Fatal(err)
	}
	if err := r.send(cluster.Update{Old: zero, New: c2, Ref: "refs/heads/next"}); err != nil {
		t.Fatal(err)
	}
	before := r.refs(r.replica.Path)
	if _, undone, err := r.rt.undoUnacked(ctx, r.replica, pl); err != nil || undone {
		t.Fatalf("undone %v (%v) though the refs moved on since", undone, err)
	}
	if got := r.refs(r.replica.Path); got != before {
		t.Fatalf("refs changed:\n%s\nwas:\n%s", got, before)
	}
	r.same()
}
