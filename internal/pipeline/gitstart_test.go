package pipeline

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"packwire/internal/gitexec"
)

// TestStartGitNeedsNewInput: a request starts one git on its request
// alone, then one more per client read that delivered bytes; beyond that
// startGit fails closed, and starts again once the client sent more.
func TestStartGitNeedsNewInput(t *testing.T) {
	var ran int
	p := &Pipeline{Log: slog.New(slog.DiscardHandler), spawn: func(context.Context, gitexec.Spec, io.Reader, io.Writer, io.Writer) (gitexec.Result, error) {
		ran++
		return gitexec.Result{}, nil
	}}
	c := &Call{p: p, input: &clientInput{r: strings.NewReader("0000")}}
	start := func() error {
		_, err := c.startGit(context.Background(), gitexec.Spec{}, nil, io.Discard, nil)
		return err
	}
	if err := start(); err != nil {
		t.Fatalf("the first git (the request's): %v", err)
	}
	if err := start(); !errors.Is(err, ErrGitWithoutInput) {
		t.Fatalf("a second git without input: %v, want ErrGitWithoutInput", err)
	}
	io.ReadAll(c.input) // one read of 4 bytes, then EOF
	if err := start(); err != nil {
		t.Fatalf("a git after new input: %v", err)
	}
	if err := start(); !errors.Is(err, ErrGitWithoutInput) {
		t.Fatalf("another git without input: %v, want ErrGitWithoutInput", err)
	}
	if ran != 2 || p.GitStarts() != 2 {
		t.Fatalf("ran %d, counted %d; want 2", ran, p.GitStarts())
	}
}

// TestIdleWatch: a session where nothing moves ends (ErrIdle) after the
// idle timeout and not before; one where something moves does not; a
// stopped watch never ends it.
func TestIdleWatch(t *testing.T) {
	const idle = 200 * time.Millisecond
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	var moved atomic.Int64
	start := time.Now()
	stop := idleWatch(idle, moved.Load, cancel)
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a session where nothing moved did not end")
	}
	stop()
	if took := time.Since(start); !errors.Is(context.Cause(ctx), gitexec.ErrIdle) || took < idle {
		t.Fatalf("ended after %v with %v, want ErrIdle after %v", took, context.Cause(ctx), idle)
	}

	// Moving for three idle periods (of a second: only a scheduling stall
	// that long could end it).
	ctx, cancel = context.WithCancelCause(context.Background())
	defer cancel(nil)
	stop = idleWatch(5*idle, moved.Load, cancel)
	for range 150 {
		time.Sleep(20 * time.Millisecond)
		moved.Add(1)
	}
	if ctx.Err() != nil {
		t.Fatalf("a moving session ended: %v", context.Cause(ctx))
	}
	stop()
	time.Sleep(2 * 5 * idle)
	if ctx.Err() != nil {
		t.Fatalf("a stopped watch ended the session: %v", context.Cause(ctx))
	}
}
