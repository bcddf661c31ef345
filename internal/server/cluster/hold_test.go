package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestHoldPushesCatchesUpUnderPushes (issue 29, item 4): a copy that
// catches up while pushes keep committing generations is never recorded
// (the generation moved while it fetched); HoldPushes takes the
// repository's turn as a push does, so that no push commits while its
// catch-up runs, records the copy, and gives the turn back. Its hold is
// bounded: a catch-up that overruns it records nothing and the pushes go
// on. A catch-up whose refs do not have the generation's digest is not
// recorded.
func TestHoldPushesCatchesUpUnderPushes(t *testing.T) {
	ctx := context.Background()
	db := openStore(t).DB
	const timeout = 5 * time.Second
	join(t, db, "a", "b", "c")
	placeOn(t, db, "app", 3, timeout)
	pl, _ := Locate(ctx, db, "app", timeout)
	primary := pl.Primary
	var voter string
	for _, n := range []string{"a", "b", "c"} {
		if n != primary && n != "c" {
			voter = n
		}
	}
	if primary == "c" {
		t.Fatalf("placement %+v: want c a replica", pl)
	}
	digestOf := func(gen int64) string { return fmt.Sprintf("digest-%d", gen) }
	// Pushes without end: each commits the next generation with the
	// voter, then records the primary's copy.
	stop := make(chan struct{})
	var pushes atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			p, err := BeginPush(ctx, db, "app", primary, timeout)
			if err != nil {
				t.Error(err)
				return
			}
			gen := p.Generation + 1
			if err := p.Commit(ctx, []string{voter}, digestOf(gen)); err != nil {
				t.Error(err)
				return
			}
			if err := RecordCopy(ctx, db, "app", primary, gen, digestOf(gen), digestOf(gen)); err != nil {
				t.Error(err)
				return
			}
			pushes.Add(1)
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	moved := func(from int64) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); pushes.Load() < from+3; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the pushes stopped at %d", pushes.Load())
			}
		}
	}
	moved(0)
	generation := func() int64 {
		var gen int64
		if err := db.QueryRow("SELECT generation FROM cluster_repos WHERE name = 'app'").Scan(&gen); err != nil {
			t.Fatal(err)
		}
		return gen
	}

	// A catch-up round that fetches while pushes go on: recorded only if
	// the generation did not move meanwhile, which it keeps doing.
	recorded := 0
	for range 3 {
		pl, err := Locate(ctx, db, "app", timeout)
		if err != nil {
			t.Fatal(err)
		}
		moved(pushes.Load()) // a fetch that takes a few pushes' time
		if ok, err := SetReplicaGeneration(ctx, db, "app", "c", pl.Generation, pl.Digest); err != nil {
			t.Fatal(err)
		} else if ok {
			recorded++
		}
	}
	if recorded != 0 {
		t.Fatalf("a copy was recorded at a generation the repository had left (%d times)", recorded)
	}

	// With the pushes held: no push commits while it runs; recorded.
	var during int64
	ok, err := HoldPushes(ctx, db, "app", "c", time.Second, timeout, func(ctx context.Context, pl Placement) (string, error) {
		before := pushes.Load()
		time.Sleep(100 * time.Millisecond) // a fetch, during which pushes would commit
		if gen := generation(); gen != pl.Generation {
			return "", fmt.Errorf("generation %d while held at %d", gen, pl.Generation)
		}
		during = pushes.Load() - before
		return pl.Digest, nil
	})
	if err != nil || !ok {
		t.Fatalf("catch-up with the pushes held: %v %v", ok, err)
	}
	// (A push may have been between its commit and its record as the
	// hold began: at most that one.)
	if during > 1 {
		t.Fatalf("%d pushes committed while held", during)
	}
	if pl, _ := Locate(ctx, db, "app", timeout); func() bool { r, _ := pl.Replica("c"); return r.Generation < 1 }() {
		t.Fatalf("c not recorded: %+v", pl)
	}
	moved(pushes.Load()) // and the pushes go on

	// A catch-up whose refs are not the generation's is not recorded.
	ok, err = HoldPushes(ctx, db, "app", "c", time.Second, timeout, func(ctx context.Context, pl Placement) (string, error) {
		if _, err := db.Exec("UPDATE replicas SET generation = -1 WHERE repo = 'app' AND node = 'c'"); err != nil {
			return "", err
		}
		return "not-the-generation's", nil
	})
	if err != nil || ok {
		t.Fatalf("a catch-up with other refs: recorded %v, %v", ok, err)
	}

	// The hold is bounded: a catch-up that overruns it gives the turn
	// back, recording nothing, and the pushes go on.
	began := time.Now()
	_, err = HoldPushes(ctx, db, "app", "c", 200*time.Millisecond, timeout, func(ctx context.Context, pl Placement) (string, error) {
		<-ctx.Done()
		return "", ctx.Err()
	})
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(began) > 5*time.Second {
		t.Fatalf("an overrun hold: %v after %s", err, time.Since(began))
	}
	moved(pushes.Load())
}

// TestDigestKnownOnlyForItsGeneration: a generation committed without a
// digest (by a node from before digests; a row from before the
// migration) has none known, even though the row still holds the one
// before: copies are recorded at it as before. A generation with a
// digest records only copies with that digest.
func TestDigestKnownOnlyForItsGeneration(t *testing.T) {
	ctx := context.Background()
	db := openStore(t).DB
	const timeout = 5 * time.Second
	join(t, db, "a", "b")
	placeOn(t, db, "app", 2, timeout)
	if pl, _ := Locate(ctx, db, "app", timeout); pl.Digest != EmptyDigest {
		t.Fatalf("a new repository's digest %q, want the empty set's", pl.Digest)
	}
	// An old node's commit: the generation moves, the digest does not.
	if _, err := db.Exec("UPDATE cluster_repos SET generation = generation + 1 WHERE name = 'app'"); err != nil {
		t.Fatal(err)
	}
	if pl, _ := Locate(ctx, db, "app", timeout); pl.Digest != "" {
		t.Fatalf("generation 1's digest %q, want none known", pl.Digest)
	}
	if ok, err := SetReplicaGeneration(ctx, db, "app", "b", 1, "anything"); !ok || err != nil {
		t.Fatalf("recording a copy at a generation without a digest: %v %v", ok, err)
	}
	if ok, _ := SetReplicaGeneration(ctx, db, "app", "a", 1, "anything"); !ok {
		t.Fatal("a not recorded")
	}
	p, err := BeginPush(ctx, db, "app", "a", timeout)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(ctx, nil, "d2"); err != nil {
		t.Fatal(err)
	}
	if pl, _ := Locate(ctx, db, "app", timeout); pl.Digest != "d2" || pl.Generation != 2 {
		t.Fatalf("after a push with a digest: %+v", pl)
	}
	if ok, _ := SetReplicaGeneration(ctx, db, "app", "b", 2, "other"); ok {
		t.Fatal("a copy with other refs recorded at a generation with a digest")
	}
	if ok, _ := SetReplicaGeneration(ctx, db, "app", "b", 2, "d2"); !ok {
		t.Fatal("a copy with the generation's refs not recorded")
	}
}
