package maintain

import (
	"context"
	"errors"
	"testing"

	"packwire/internal/governor"
	"packwire/internal/repolock"
)

// One maintainer per repository: a second lock is refused at once until the
// first is released.
func TestLockIsExclusive(t *testing.T) {
	dir := t.TempDir()
	unlock, err := lock(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock(dir); !errors.Is(err, ErrBusy) {
		t.Fatalf("second lock: %v, want ErrBusy", err)
	}
	unlock()
	again, err := lock(dir)
	if err != nil {
		t.Fatalf("lock after unlock: %v", err)
	}
	again()
}

// A repository being moved (repo delete or rename holds its move lock) is
// skipped like one being maintained, and a run holds the move lock so that
// no delete or rename moves the repository under it.
func TestRunAndMoveLock(t *testing.T) {
	_, r := newRepo(t)
	m := quietMaintainer()
	mover, err := repolock.TryExclusive(r.Path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Run(context.Background(), r, Geometric, "test"); !errors.Is(err, ErrBusy) {
		t.Fatalf("run while the repository is being moved: %v, want ErrBusy", err)
	}
	mover.Release()
	var during error
	m.Record = func(context.Context, governor.MaintenanceRun) error {
		// Recorded at the end of the run, still under its locks.
		_, during = repolock.TryExclusive(r.Path)
		return nil
	}
	if _, err := m.Run(context.Background(), r, Geometric, "test"); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(during, repolock.ErrBusy) {
		t.Fatalf("a move during a run: %v, want ErrBusy", during)
	}
	if l, err := repolock.TryExclusive(r.Path); err != nil {
		t.Fatalf("move lock after the run: %v", err)
	} else {
		l.Release()
	}
}
