package store

import (
	"context"
	"path/filepath"
	"testing"
)

// Version moves on every committed write, from this handle or another
// one on the same file (an admin command while the server runs), and
// stays put for reads: the access cache depends on both.
func TestVersionMovesOnEveryWrite(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "packwire.db")
	a, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	version := func() int64 {
		t.Helper()
		v, ok, err := a.Version(ctx)
		if err != nil || !ok {
			t.Fatalf("Version: %v %v", ok, err)
		}
		return v
	}
	v := version()
	if _, err := a.Grants(ctx, "nobody"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Setting(ctx, "anonymous-read", "on"); err != nil {
		t.Fatal(err)
	}
	if got := version(); got != v {
		t.Fatalf("reads moved the version: %d -> %d", v, got)
	}
	writes := []struct {
		name  string
		write func() error
	}{
		{"a setting through this handle", func() error { return a.SetSetting(ctx, "anonymous-read", "off") }},
		{"a setting through another handle", func() error { return b.SetSetting(ctx, "anonymous-read", "on") }},
		{"a user through another handle", func() error { _, err := b.AddUser(ctx, "bob"); return err }},
		{"a grant through another handle", func() error { return b.SetGrant(ctx, Grant{User: "bob", RepoPattern: "**", Role: "read"}) }},
		{"a revocation through another handle", func() error { return b.RemoveGrant(ctx, "bob", "**") }},
		{"a revocation through this handle", func() error {
			if err := a.SetGrant(ctx, Grant{User: "bob", RepoPattern: "x", Role: "read"}); err != nil {
				return err
			}
			version()
			return a.RemoveGrant(ctx, "bob", "x")
		}},
	}
	for _, w := range writes {
		before := version()
		if err := w.write(); err != nil {
			t.Fatalf("%s: %v", w.name, err)
		}
		if after := version(); after == before {
			t.Errorf("%s: version stayed %d", w.name, before)
		}
	}
}

// A caller whose context is gone (a client that hung up) gets the version
// as it stands, and does not move it for everyone else: that would drop
// every access model kept at it.
func TestVersionOutlivesACancelledCaller(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "packwire.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	v, _, err := s.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	s.Version(gone)
	if again, _, err := s.Version(ctx); err != nil || again != v {
		t.Fatalf("after a cancelled caller: version %d (%v), was %d", again, err, v)
	}
}
