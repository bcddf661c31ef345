package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"packwire/internal/repo"
	"packwire/internal/store"
)

// TestRestorePicksTheDeletedCopies: a restore places the repository on the
// nodes whose trash holds a copy of the chosen deletion, each at the
// generation it had, the old primary primary again; copies of another
// deletion, copies still being deleted and a lost copy are handled.
func TestRestorePicksTheDeletedCopies(t *testing.T) {
	ctx := context.Background()
	db := openStore(t).DB
	const timeout = time.Minute
	join(t, db, "a", "b", "c")
	trashAll := func(stamp string) {
		t.Helper()
		for _, n := range []string{"a", "b", "c"} {
			if err := Deleted(ctx, db, "team/app", n, stamp+"-"+n); err != nil {
				t.Fatal(err)
			}
		}
	}
	// First life: deleted at generation 0 everywhere.
	if _, err := Place(ctx, db, "team/app", "", 3, timeout); err != nil {
		t.Fatal(err)
	}
	db.Exec("UPDATE replicas SET generation = 0")
	if _, err := Delete(ctx, db, "team/app"); err != nil {
		t.Fatal(err)
	}
	if _, err := Restore(ctx, db, "team/app", ""); err == nil || !strings.Contains(err.Error(), "has not moved its copy") {
		t.Fatalf("restore while the deletion is carried out: %v", err)
	}
	trashAll("one")
	var first []TrashedRepo
	var err error
	if first, err = Trash(ctx, db); err != nil || len(first) != 1 || len(first[0].Nodes) != 3 {
		t.Fatalf("trash after the first deletion: %+v %v", first, err)
	}
	// Second life: primary b at generation 5, a at 5, c behind at 4.
	time.Sleep(1100 * time.Millisecond) // a deletion stamp of its own
	if _, err := Place(ctx, db, "team/app", "", 3, timeout); err != nil {
		t.Fatal(err)
	}
	db.Exec("UPDATE cluster_repos SET generation = 5, primary_node = 'b' WHERE name = 'team/app'")
	db.Exec("UPDATE replicas SET generation = CASE node WHEN 'c' THEN 4 ELSE 5 END WHERE repo = 'team/app'")
	if _, err := Delete(ctx, db, "team/app"); err != nil {
		t.Fatal(err)
	}
	trashAll("two")
	list, err := Trash(ctx, db)
	if err != nil || len(list) != 2 {
		t.Fatalf("trash after two deletions: %+v %v", list, err)
	}
	if _, err := Restore(ctx, db, "team/app", "20000101T000000Z"); err == nil || !strings.Contains(err.Error(), list[0].Stamp()) {
		t.Fatalf("restore at a stamp that is none: %v", err)
	}
	if _, err := Restore(ctx, db, "team/none", ""); !errors.Is(err, repo.ErrNotInTrash) {
		t.Fatalf("restore of a name never deleted: %v", err)
	}
	p, err := Restore(ctx, db, "team/app", "")
	if err != nil {
		t.Fatal(err)
	}
	if p.Primary != "b" || p.Generation != 5 {
		t.Fatalf("restored %+v: want primary b at generation 5", p)
	}
	pl, err := Locate(ctx, db, "team/app", timeout)
	if err != nil || !pl.UpToDate("a") || !pl.UpToDate("b") || pl.UpToDate("c") {
		t.Fatalf("restored placement %+v %v: a and b current, c behind", pl, err)
	}
	pending, err := Restores(ctx, db, "c")
	if err != nil || len(pending) != 1 || pending[0].Stamp != "two-c" {
		t.Fatalf("c's restore: %+v %v", pending, err)
	}
	if arriving, err := Arriving(ctx, db, "team/app", "c"); !arriving || err != nil {
		t.Fatalf("c's copy arriving: %v %v", arriving, err)
	}
	// c's copy was removed for good meanwhile: c fetches it anew.
	if err := Restored(ctx, db, "team/app", "c", true); err != nil {
		t.Fatal(err)
	}
	if pl, _ := Locate(ctx, db, "team/app", timeout); pl.Replicas[2].Generation != -1 {
		t.Fatalf("a lost copy: %+v", pl.Replicas)
	}
	if arriving, _ := Arriving(ctx, db, "team/app", "c"); arriving {
		t.Fatal("still arriving after it was recorded lost")
	}
	// The older deletion is still restorable under another name only.
	if _, err := Restore(ctx, db, "team/app", list[0].Stamp()); !errors.Is(err, store.ErrExists) {
		t.Fatalf("restore over a repository of the same name: %v", err)
	}
	if err := TrashRemoved(ctx, db, "team/app", "a", "one-a"); err != nil {
		t.Fatal(err)
	}
	if list, _ := Trash(ctx, db); len(list) != 1 || strings.Join(list[0].Nodes, ",") != "b,c" {
		t.Fatalf("trash after a's copy was removed for good: %+v", list)
	}
}

// TestRenameRefusals: a rename may not take a name that is taken, nested
// in or holding another repository, or still being moved away from.
func TestRenameRefusals(t *testing.T) {
	ctx := context.Background()
	db := openStore(t).DB
	const timeout = time.Minute
	join(t, db, "a", "b")
	for _, name := range []string{"team/app", "team/lib", "solo"} {
		if _, err := Place(ctx, db, name, "", 2, timeout); err != nil {
			t.Fatal(err)
		}
	}
	for _, to := range []string{"team/lib", "team/lib/inner", "team", "solo/x", "team/app"} {
		if _, err := Rename(ctx, db, "team/app", to); err == nil {
			t.Fatalf("rename team/app -> %s was taken", to)
		}
	}
	if _, err := Place(ctx, db, "team/app/inner", "", 1, timeout); err == nil {
		t.Fatal("a repository placed inside another")
	}
	nodes, err := Rename(ctx, db, "team/app", "team/ap_p")
	if err != nil || len(nodes) != 2 {
		t.Fatalf("rename: %v %v", nodes, err)
	}
	// "team/ap_p" is no pattern: "team/apxp/..." is free.
	if _, err := Place(ctx, db, "team/apxp/inner", "", 1, timeout); err != nil {
		t.Fatalf("a name LIKE would have matched: %v", err)
	}
	if _, err := Place(ctx, db, "team/app", "", 1, timeout); err == nil || !strings.Contains(err.Error(), "has not moved its copy") {
		t.Fatalf("placing the old name before every node moved its copy: %v", err)
	}
	// Renamed twice before a node ran: carried out in order.
	if _, err := Rename(ctx, db, "team/ap_p", "team/third"); err != nil {
		t.Fatal(err)
	}
	renames, err := Renames(ctx, db, "a")
	if err != nil || len(renames) != 2 || renames[0].To != "team/ap_p" || renames[1].From != "team/ap_p" {
		t.Fatalf("a's renames: %+v %v", renames, err)
	}
	if leaving, _ := MovingAway(ctx, db, "team/app", "a"); !leaving {
		t.Fatal("the old name is not moving away")
	}
	for _, r := range renames {
		if err := Renamed(ctx, db, r.ID); err != nil {
			t.Fatal(err)
		}
	}
	if leaving, _ := MovingAway(ctx, db, "team/app", "a"); leaving {
		t.Fatal("still moving away after the renames")
	}
}
