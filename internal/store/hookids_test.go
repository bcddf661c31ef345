package store

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
)

// TestHookIDsNeverReused: after the newest hooks are removed, a new hook
// gets an id never used before, on SQLite and on PostgreSQL, so that its
// deliveries are its own. On the old code SQLite gave the new hook id 1
// and "hook deliveries 1" listed the removed hook's.
func TestHookIDsNeverReused(t *testing.T) {
	lite, pgStore := openBoth(t)
	for name, st := range map[string]*Store{"sqlite": lite, "postgres": pgStore} {
		t.Run(name, func(t *testing.T) { checkHookIDs(t, st, 0) })
	}
}

// TestHookIDsMigration: a SQLite store made before migration 12, whose
// newest hook was removed while its deliveries stay, gives the next hook a
// new id once migrated.
func TestHookIDsMigration(t *testing.T) {
	ctx := WithActor(context.Background(), "cli:test")
	path := filepath.Join(t.TempDir(), "packwire.db")
	old, err := OpenWith(ctx, path, migrations[:11])
	if err != nil {
		t.Fatal(err)
	}
	first := addHookWithDelivery(t, old)
	second := addHookWithDelivery(t, old)
	if err := old.RemoveHook(ctx, second); err != nil {
		t.Fatal(err)
	}
	old.Close()
	st, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if h, err := st.GetHook(ctx, first); err != nil || h.URL != "https://ci.example/h" {
		t.Fatalf("hook %d after the migration: %+v %v", first, h, err)
	}
	checkHookIDs(t, st, second)
}

func addHookWithDelivery(t *testing.T, st *Store) int64 {
	t.Helper()
	ctx := WithActor(context.Background(), "cli:test")
	id, err := st.AddHook(ctx, Hook{RepoPattern: "team/*", URL: "https://ci.example/h", Events: []string{"push"}})
	if err != nil {
		t.Fatal(err)
	}
	err = st.EnqueueDeliveries(ctx, []NewDelivery{{Kind: KindWebhook, Target: fmt.Sprint(id), Repo: "team/app", Event: "push", Payload: []byte("{}")}})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// checkHookIDs adds two hooks with a delivery each, removes both, adds a
// third: its id is above both and above highest (an id used before), and
// it has no deliveries.
func checkHookIDs(t *testing.T, st *Store, highest int64) {
	t.Helper()
	ctx := WithActor(context.Background(), "cli:test")
	a, b := addHookWithDelivery(t, st), addHookWithDelivery(t, st)
	for _, id := range []int64{a, b} {
		if err := st.RemoveHook(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	c, err := st.AddHook(ctx, Hook{RepoPattern: "team/*", URL: "https://ci.example/new", Events: []string{"push"}})
	if err != nil {
		t.Fatal(err)
	}
	if c <= max(a, b, highest) {
		t.Fatalf("hooks %d and %d removed (highest id before: %d), then a new hook got id %d: reused", a, b, highest, c)
	}
	ds, err := st.Deliveries(ctx, DeliveryFilter{Kind: KindWebhook, Target: fmt.Sprint(c)})
	if err != nil || len(ds) != 0 {
		t.Fatalf("the new hook %d has deliveries it never had: %d %v", c, len(ds), err)
	}
}
