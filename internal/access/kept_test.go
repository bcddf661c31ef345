package access

import (
	"context"
	"errors"
	"testing"

	"packwire/internal/pgtest"
	"packwire/internal/store"
)

// Two nodes of a cluster on one PostgreSQL: what one node's controller
// keeps between requests is dropped by a change committed through
// another node's store (an admin command on any machine), at the very
// next request, and kept while nothing changes.
func TestPostgresAccessKeptAcrossNodesUntilAChange(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Start(t).NewDatabase(t)
	open := func() *store.Store {
		st, err := store.OpenPostgres(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	admin, nodeStore := open(), open()
	node := &Controller{Store: nodeStore}
	if _, err := admin.AddUser(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	if err := admin.SetSetting(ctx, SettingAnonRead, "off"); err != nil {
		t.Fatal(err)
	}
	token, err := (&Controller{Store: admin}).CreateToken(ctx, "alice", 0)
	if err != nil {
		t.Fatal(err)
	}
	alice := Principal{User: "alice", Via: "token"}
	decide := func(op Op) error {
		t.Helper()
		m, err := node.Load(ctx, alice)
		if err != nil {
			t.Fatal(err)
		}
		return m.Decide(alice, op, "team/app")
	}

	if err := decide(Read); !errors.Is(err, ErrNoRead) {
		t.Fatalf("before any grant: %v", err)
	}
	if err := admin.SetGrant(ctx, store.Grant{User: "alice", RepoPattern: "team/*", Role: "write"}); err != nil {
		t.Fatal(err)
	}
	if err := decide(Write); err != nil {
		t.Fatalf("the request right after a grant: %v", err)
	}
	// Nothing changed: the model is kept, not read again.
	first, _ := node.Load(ctx, alice)
	if again, _ := node.Load(ctx, alice); again != first {
		t.Fatal("the access model was read again with nothing changed")
	}
	if _, err := node.PrincipalForToken(ctx, "alice", token); err != nil {
		t.Fatal(err)
	}
	if _, ok := node.kept.token(mustVersion(t, nodeStore), TokenID(token)); !ok {
		t.Fatal("the token was not kept")
	}

	// A request is decided as of its token's check (one version read for
	// both), but only that once: a principal kept for later requests
	// reads the version again.
	checked, err := node.PrincipalForToken(ctx, "alice", token)
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.RemoveGrant(ctx, "alice", "team/*"); err != nil {
		t.Fatal(err)
	}
	if m, err := node.Load(ctx, checked); err != nil || m.Decide(checked, Write, "team/app") != nil {
		t.Fatalf("the request whose token was checked before the revocation: %v", err)
	}
	if m, err := node.Load(ctx, checked); err != nil || !errors.Is(m.Decide(checked, Write, "team/app"), ErrNoRead) {
		t.Fatalf("a later request of the same principal after a revocation: %v", err)
	}
	// The same request relayed to another node is decided there as of the
	// same check, once.
	v, ok := checked.CheckedVersion()
	if !ok {
		t.Fatal("no checked version to relay")
	}
	other := &Controller{Store: open()}
	relayed := WithCheckedVersion(Principal{User: "alice", Via: "token"}, v)
	if m, err := other.Load(ctx, relayed); err != nil || !errors.Is(m.Decide(relayed, Write, "team/app"), ErrNoRead) {
		// Nothing kept there at v: read now, after the revocation.
		t.Fatalf("relayed, nothing kept at the checked version: %v", err)
	}
	if err := decide(Write); !errors.Is(err, ErrNoRead) {
		t.Fatalf("the request right after a revocation on another node: %v", err)
	}
	if err := admin.RevokeToken(ctx, TokenID(token)); err != nil {
		t.Fatal(err)
	}
	if _, err := node.PrincipalForToken(ctx, "alice", token); !errors.Is(err, ErrBadCredentials) {
		t.Fatalf("a token revoked on another node: %v", err)
	}
	if m, _ := node.Load(ctx, Anonymous); m.AnonRead("team/app") {
		t.Fatal("anonymous read while off")
	}
	if err := admin.SetAnonRead(ctx, store.AnonRead{RepoPattern: "team/*", Enabled: true}); err != nil {
		t.Fatal(err)
	}
	if m, _ := node.Load(ctx, Anonymous); !m.AnonRead("team/app") {
		t.Fatal("anonymous read switched on on another node does not apply")
	}
}

func mustVersion(t *testing.T, st *store.Store) int64 {
	t.Helper()
	v, ok, err := st.Version(context.Background())
	if err != nil || !ok {
		t.Fatalf("Version: %v %v", ok, err)
	}
	return v
}
