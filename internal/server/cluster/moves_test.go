package cluster

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// TestMoveCopyRules: a copy goes only while another copy holds the
// repository's generation; a primary's copy hands the primary (and a new
// epoch) to a healthy copy at the generation, or is refused; copies are
// added only on healthy nodes; a node that is down and holds nothing can
// be forgotten.
func TestMoveCopyRules(t *testing.T) {
	ctx := context.Background()
	db := openStore(t).DB
	const timeout = time.Hour // every node healthy unless its heartbeat is set back
	join(t, db, "a", "b", "c", "d")
	if _, err := Place(ctx, db, "team/app", "", 3, timeout); err != nil {
		t.Fatal(err)
	}
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	placement := func() Placement {
		t.Helper()
		p, err := Locate(ctx, db, "team/app", timeout)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	copies := func() []string {
		var out []string
		for _, r := range placement().Replicas {
			out = append(out, r.Node)
		}
		slices.Sort(out)
		return out
	}
	refused := func(err error, what string) {
		t.Helper()
		if !errors.Is(err, ErrMoveRefused) {
			t.Fatalf("%s: %v, want a refusal", what, err)
		}
	}
	// Generation 1 is on a and b; c missed it.
	exec("UPDATE cluster_repos SET generation = 1 WHERE name = 'team/app'")
	exec("UPDATE replicas SET generation = 1 WHERE repo = 'team/app' AND node IN ('a', 'b')")
	exec("UPDATE replicas SET generation = 0 WHERE repo = 'team/app' AND node = 'c'")

	if to, err := MoveTarget(ctx, db, "team/app", timeout); err != nil || to != "d" {
		t.Fatalf("move target: %q %v, want d", to, err)
	}
	refused(DropCopy(ctx, db, "team/app", "d", "", timeout), "dropping a copy d does not hold")
	refused(DropCopy(ctx, db, "team/app", "c", "b", timeout), "adding a copy where there is one")
	if added, err := AddCopy(ctx, db, "team/app", "b", timeout); added || err != nil {
		t.Fatalf("adding b's copy again: %v %v", added, err)
	}
	if _, err := AddCopy(ctx, db, "team/app", "nowhere", timeout); !errors.Is(err, ErrMoveRefused) {
		t.Fatalf("a copy on an unknown node: %v", err)
	}

	// Only a holds generation 1: its copy may not go, primary or not.
	exec("UPDATE replicas SET generation = 0 WHERE repo = 'team/app' AND node = 'b'")
	refused(DropCopy(ctx, db, "team/app", "a", "d", timeout), "dropping the only copy at the generation")
	if got := copies(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("a refused move changed the copies: %v", got)
	}

	// With b at the generation, a's copy goes and b becomes primary, in a
	// new epoch; d gets a copy to make.
	exec("UPDATE replicas SET generation = 1 WHERE repo = 'team/app' AND node = 'b'")
	before := placement()
	if err := DropCopy(ctx, db, "team/app", "a", "d", timeout); err != nil {
		t.Fatal(err)
	}
	after := placement()
	if after.Primary != "b" || after.Epoch != before.Epoch+1 {
		t.Fatalf("after moving the primary's copy: primary %s epoch %d, want b, %d", after.Primary, after.Epoch, before.Epoch+1)
	}
	if got := copies(); !slices.Equal(got, []string{"b", "c", "d"}) {
		t.Fatalf("copies %v, want b c d", got)
	}
	if d, _ := after.Replica("d"); d.Generation != -1 {
		t.Fatalf("d's new copy at generation %d, want -1 (to be made)", d.Generation)
	}

	// b is primary and the only copy at the generation besides c, which is
	// down: no healthy copy can take over.
	exec("UPDATE replicas SET generation = 1 WHERE repo = 'team/app' AND node = 'c'")
	exec("UPDATE nodes SET heartbeat_ms = heartbeat_ms - 7200000 WHERE name = 'c'")
	if _, err := AddCopy(ctx, db, "team/app", "c", timeout); !errors.Is(err, ErrMoveRefused) {
		t.Fatalf("a copy on a node that is down: %v", err)
	}
	refused(DropCopy(ctx, db, "team/app", "b", "a", timeout), "moving the primary with no healthy copy to take over")

	// c, down, is dropped; a, healthy, takes its place.
	if err := DropCopy(ctx, db, "team/app", "c", "a", timeout); err != nil {
		t.Fatal(err)
	}
	if got := copies(); !slices.Equal(got, []string{"a", "b", "d"}) {
		t.Fatalf("copies %v, want a b d", got)
	}
	// c holds nothing and is down: forgotten. d is healthy: kept.
	if forgot, err := Forget(ctx, db, "d", timeout); forgot || err != nil {
		t.Fatalf("forgetting healthy d: %v %v", forgot, err)
	}
	if forgot, err := Forget(ctx, db, "c", timeout); !forgot || err != nil {
		t.Fatalf("forgetting c: %v %v", forgot, err)
	}
	if _, err := Healthy(ctx, db, "c", timeout); err == nil {
		t.Fatal("c is still a node")
	}
}
