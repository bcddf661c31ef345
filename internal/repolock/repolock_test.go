package repolock

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Holders share; a mover is refused while any holds it, and holders wait
// while a mover holds it.
func TestSharedAndExclusive(t *testing.T) {
	dir := t.TempDir()
	a, err := TryShared(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := TryShared(dir)
	if err != nil {
		t.Fatalf("second shared lock: %v", err)
	}
	if _, err := TryExclusive(dir); !errors.Is(err, ErrBusy) {
		t.Fatalf("exclusive while shared: %v, want ErrBusy", err)
	}
	a.Release()
	b.Release()
	x, err := TryExclusive(dir)
	if err != nil {
		t.Fatalf("exclusive once released: %v", err)
	}
	if _, err := TryShared(dir); !errors.Is(err, ErrBusy) {
		t.Fatalf("shared while exclusive: %v, want ErrBusy", err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := Shared(context.Background(), dir)
		l.Release()
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("Shared returned while a mover held the lock: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	x.Release()
	if err := <-got; err != nil {
		t.Fatalf("Shared after the mover released: %v", err)
	}
}

// A holder that waited out a move finds the repository gone.
func TestSharedAfterMove(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "app.git")
	os.Mkdir(dir, 0o755)
	x, err := TryExclusive(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := Shared(context.Background(), dir)
		got <- err
	}()
	time.Sleep(20 * time.Millisecond)
	if err := os.Rename(dir, filepath.Join(root, "moved.git")); err != nil {
		t.Fatal(err)
	}
	x.Release()
	if err := <-got; !errors.Is(err, ErrMoved) {
		t.Fatalf("Shared on a moved repository: %v, want ErrMoved", err)
	}
	if _, err := TryShared(dir); !errors.Is(err, ErrMoved) {
		t.Fatalf("TryShared on a missing directory: %v, want ErrMoved", err)
	}
}
