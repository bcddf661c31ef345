package cluster_test

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"packwire/internal/pgtest"
	"packwire/internal/repo"
	"packwire/internal/server/cluster"
	"packwire/internal/server/cluster/route"
	"packwire/internal/store"
)

// TestRenamedThenDeletedGoesToTrash: a repository renamed and then
// deleted before its node moved its copy is moved to the new name and
// then into the node's trash, restorable; the old order (deletions
// first) found no copy under the new name, recorded none, and left the
// renamed copy on disk with nothing to restore.
func TestRenamedThenDeletedGoesToTrash(t *testing.T) {
	ctx := context.Background()
	st, err := store.OpenPostgres(ctx, pgtest.Shared(t).NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	node := &cluster.Node{DB: st.DB, Name: "a", URL: "http://a", Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if err := node.Join(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.Place(ctx, st.DB, "team/app", "", 1, time.Minute); err != nil {
		t.Fatal(err)
	}
	root := repo.Root{Dir: filepath.Join(t.TempDir(), "repos")}
	if _, err := root.Create(ctx, "team/app"); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.Rename(ctx, st.DB, "team/app", "team/new"); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.Delete(ctx, st.DB, "team/new"); err != nil {
		t.Fatal(err)
	}
	rt := &route.Router{Node: node, Repos: root}
	rt.Reconcile(ctx)
	trash, err := cluster.Trash(ctx, st.DB)
	if err != nil || len(trash) != 1 || trash[0].Name != "team/new" {
		t.Fatalf("the cluster's trash after the node reconciled: %+v (%v)", trash, err)
	}
	if _, err := root.Resolve("team/new"); err == nil {
		t.Fatal("the deleted repository's copy is still served from the node's disk")
	}
}
