package repolock

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
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

// Serial's holder in another process (this test binary, run again) keeps
// a second Serial waiting until it exits; the lock is then taken.
func TestSerialAcrossProcesses(t *testing.T) {
	if dir := os.Getenv("REPOLOCK_SERIAL_HOLD"); dir != "" {
		l, err := Serial(context.Background(), dir, "serial.lock")
		if err != nil {
			os.Exit(3)
		}
		os.Stdout.WriteString("held\n")
		io.Copy(io.Discard, os.Stdin) // until the parent closes it
		l.Release()
		os.Exit(0)
	}
	dir := t.TempDir()
	child := exec.Command(os.Args[0], "-test.run=^TestSerialAcrossProcesses$")
	child.Env = append(os.Environ(), "REPOLOCK_SERIAL_HOLD="+dir)
	stdin, _ := child.StdinPipe()
	stdout, _ := child.StdoutPipe()
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Process.Kill()
	if line, _ := bufio.NewReader(stdout).ReadString('\n'); line != "held\n" {
		t.Fatalf("holder said %q", line)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := Serial(ctx, dir, "serial.lock"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Serial while another process holds it: %v, want a wait cut by its context", err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := Serial(context.Background(), dir, "serial.lock")
		l.Release()
		got <- err
	}()
	stdin.Close()
	if err := child.Wait(); err != nil {
		t.Fatalf("holder: %v", err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serial still waiting after the holder exited")
	}
}
