package lifecycle

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"packwire/internal/repo"
	"packwire/internal/repolock"
)

// A holder of the move lock (a push, maintenance, a backup) makes delete
// and rename refuse without moving anything.
func TestMovesRefusedWhileHeld(t *testing.T) {
	root := repo.Root{Dir: filepath.Join(t.TempDir(), "repos")}
	r, err := root.Create(context.Background(), "team/app")
	if err != nil {
		t.Fatal(err)
	}
	held, err := repolock.TryShared(r.Path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Delete(root, "team/app", time.Now()); !errors.Is(err, ErrBusy) {
		t.Fatalf("delete while held: %v", err)
	}
	if _, _, err := Rename(root, "team/app", "team/new"); !errors.Is(err, ErrBusy) {
		t.Fatalf("rename while held: %v", err)
	}
	if _, err := root.Resolve("team/app"); err != nil {
		t.Fatal(err)
	}
	held.Release()
	if _, _, err := Rename(root, "team/app", "team/new"); err != nil {
		t.Fatal(err)
	}
	if _, err := Delete(root, "team/app", time.Now()); !errors.Is(err, repo.ErrNotFound) {
		t.Fatalf("delete of the old name: %v", err)
	}
}

// Restore takes the last deleted version unless told which; expiry keeps
// what is within the retention.
func TestRestoreAndExpire(t *testing.T) {
	root := repo.Root{Dir: filepath.Join(t.TempDir(), "repos")}
	ctx := context.Background()
	day := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	for i := range 3 {
		if _, err := root.Create(ctx, "app"); err != nil {
			t.Fatal(err)
		}
		if _, err := Delete(root, "app", day.Add(time.Duration(i)*24*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	_, got, err := Restore(root, "app", "")
	if err != nil || got.Stamp() != "20260303T000000Z" {
		t.Fatalf("restore the last: %+v %v", got, err)
	}
	if _, _, err := Restore(root, "app", "20260302T000000Z"); !errors.Is(err, repo.ErrExists) {
		t.Fatalf("restore over the restored one: %v", err)
	}
	if _, _, err := Restore(root, "app", "20990101T000000Z"); err == nil {
		t.Fatal("restored a version never deleted")
	}
	if _, _, err := Restore(root, "other", ""); !errors.Is(err, repo.ErrNotInTrash) {
		t.Fatalf("restore of a name never deleted: %v", err)
	}
	removed, err := ExpireTrash(root, 36*time.Hour, day.Add(49*time.Hour))
	if err != nil || len(removed) != 1 || removed[0].Stamp() != "20260301T000000Z" {
		t.Fatalf("expire: %+v %v", removed, err)
	}
	if list, _ := root.ListTrash(); len(list) != 1 || list[0].Stamp() != "20260302T000000Z" {
		t.Fatalf("trash after expiry: %+v", list)
	}
}
