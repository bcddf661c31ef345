package store

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"packwire/internal/pgtest"
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

// On PostgreSQL, where other nodes write too, Version moves on every
// committed write to a table that decides access, made through another
// handle (another node, an admin command on another machine), and stays
// put for reads and for the cluster's own writes (every push writes
// those: the access cache must outlive them).
func TestPostgresVersionMovesOnEveryAccessWrite(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Shared(t).NewDatabase(t)
	a, err := OpenPostgres(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := OpenPostgres(ctx, url)
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
	if _, err := b.AddUser(ctx, "bob"); err != nil {
		t.Fatal(err)
	}
	v := version()
	if _, err := a.Grants(ctx, "bob"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Rules(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.DB.Exec(`INSERT INTO nodes(name, url, started_ms, heartbeat_ms) VALUES('n1', 'http://n1', 1, 1)`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.DB.Exec(`UPDATE nodes SET heartbeat_ms = 2 WHERE name = 'n1'`); err != nil {
		t.Fatal(err)
	}
	if got := version(); got != v {
		t.Fatalf("reads or cluster writes moved the version: %d -> %d", v, got)
	}
	// A failed write moves nothing either: the bump is in its transaction.
	if _, err := b.AddUser(ctx, "bob"); !errors.Is(err, ErrExists) {
		t.Fatalf("adding bob twice: %v", err)
	}
	if got := version(); got != v {
		t.Fatalf("a rolled back write moved the version: %d -> %d", v, got)
	}
	const key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ8s5m0p0vYQ0pVQ6fS2k0Jm2sHk3l0bG5o3q1Zt2Cw5 bob@x"
	writes := []struct {
		name  string
		write func() error
	}{
		{"a setting", func() error { return b.SetSetting(ctx, "anonymous-read", "off") }},
		{"a grant", func() error { return b.SetGrant(ctx, Grant{User: "bob", RepoPattern: "**", Role: "write"}) }},
		{"a revoked grant", func() error { return b.RemoveGrant(ctx, "bob", "**") }},
		{"anonymous read", func() error { return b.SetAnonRead(ctx, AnonRead{RepoPattern: "pub/*", Enabled: true}) }},
		{"a rule", func() error {
			_, err := b.InsertRules(ctx, 0, Rule{Allow: false, Ops: "delete", RepoPattern: "**", RefPattern: "refs/heads/main", Who: "*"})
			return err
		}},
		{"a removed rule", func() error { _, err := b.RemoveRule(ctx, 1); return err }},
		{"a key", func() error { return b.AddKey(ctx, "bob", Key{Fingerprint: "SHA256:test", PublicKey: key}) }},
		{"a removed key", func() error { _, err := b.RemoveKey(ctx, "SHA256:test"); return err }},
		{"a token", func() error { return b.AddToken(ctx, "bob", "tok1", []byte("hash"), time.Time{}, "") }},
		{"a revoked token", func() error { return b.RevokeToken(ctx, "tok1") }},
		{"a removed user", func() error { return b.RemoveUser(ctx, "bob") }},
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
