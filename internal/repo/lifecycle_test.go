package repo

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A deleted repository is out of reach under its name, listed in the trash
// (every deleted version, a second apart when deleted within one second),
// and comes back only while the name is free.
func TestTrashAndUntrash(t *testing.T) {
	root := Root{Dir: filepath.Join(t.TempDir(), "repos")}
	ctx := context.Background()
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var first Trashed
	for i := range 2 {
		r, err := root.Create(ctx, "team/app")
		if err != nil {
			t.Fatal(err)
		}
		tr, err := root.MoveToTrash(r, at)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = tr
		}
		if _, err := root.Resolve("team/app"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("resolve after delete: %v", err)
		}
	}
	if repos, _ := root.List(); len(repos) != 0 {
		t.Fatalf("List shows the trash: %v", repos)
	}
	list, err := root.ListTrash()
	if err != nil || len(list) != 2 {
		t.Fatalf("trash: %v %v", list, err)
	}
	if list[0].Stamp() != "20260301T120000Z" || list[1].Stamp() != "20260301T120001Z" || list[0].Name != "team/app" || list[0].Path != first.Path {
		t.Fatalf("trash: %+v", list)
	}
	if _, err := root.Create(ctx, "team/app"); err != nil {
		t.Fatal(err)
	}
	if _, err := root.Untrash(list[0]); !errors.Is(err, ErrExists) {
		t.Fatalf("untrash over an existing repository: %v", err)
	}
	r, _ := root.Resolve("team/app")
	os.RemoveAll(r.Path)
	back, err := root.Untrash(list[0])
	if err != nil || back.Name != "team/app" || !IsBare(back.Path) {
		t.Fatalf("untrash: %+v %v", back, err)
	}
	if list, _ = root.ListTrash(); len(list) != 1 || list[0].Stamp() != "20260301T120001Z" {
		t.Fatalf("trash after untrash: %+v", list)
	}
	if err := root.RemoveTrashed(list[0]); err != nil {
		t.Fatal(err)
	}
	if list, _ = root.ListTrash(); len(list) != 0 {
		t.Fatalf("trash after removal: %+v", list)
	}
	if err := root.RemoveTrashed(Trashed{Path: root.Dir}); err == nil {
		t.Fatal("RemoveTrashed took a path outside the trash")
	}
}

func TestMove(t *testing.T) {
	root := Root{Dir: filepath.Join(t.TempDir(), "repos")}
	ctx := context.Background()
	a, _ := root.Create(ctx, "team/app")
	root.Create(ctx, "team/other")
	for _, bad := range []string{"team/other", "../x", "team/app/inner", ".trash/x"} {
		if _, err := root.Move(a, bad); err == nil {
			t.Errorf("move to %q accepted", bad)
		}
	}
	moved, err := root.Move(a, "/archive/2026/app.git")
	if err != nil || moved.Name != "archive/2026/app" {
		t.Fatalf("move: %+v %v", moved, err)
	}
	if _, err := root.Resolve("team/app"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("old name after move: %v", err)
	}
	if r, err := root.Resolve("archive/2026/app"); err != nil || r.Path != moved.Path {
		t.Fatalf("new name after move: %+v %v", r, err)
	}
}

func TestDescription(t *testing.T) {
	root := Root{Dir: filepath.Join(t.TempDir(), "repos")}
	r, _ := root.Create(context.Background(), "app")
	if d := Description(r); d != "" {
		t.Fatalf("git's placeholder shown as a description: %q", d)
	}
	if err := SetDescription(r, "  The app: builds and ships  "); err != nil {
		t.Fatal(err)
	}
	if d := Description(r); d != "The app: builds and ships" {
		t.Fatalf("description %q", d)
	}
	if err := SetDescription(r, "two\nlines"); err == nil {
		t.Fatal("a two-line description was taken")
	}
}
