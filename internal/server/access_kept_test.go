package server

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"packwire/internal/datadir"
	"packwire/internal/store"
)

// TestAccessChangesApplyToTheVeryNextRequest: access answers are kept
// between requests (access.Controller), yet every change, made by another
// process's handle on the store as the admin commands do, applies to the
// very next request over every transport: a revoked grant, a removed key,
// anonymous read switched off; and a new grant is usable at once.
func TestAccessChangesApplyToTheVeryNextRequest(t *testing.T) {
	t.Parallel()
	s := startAccessServer(t)
	ctx := context.Background()
	s.seed(t, "kept/app")
	bob := s.addUser(t, "bob")
	s.grant(t, "bob", "read", "kept/*")
	if err := s.Data.Store.SetSetting(ctx, "anonymous-read", "off"); err != nil {
		t.Fatal(err)
	}
	if err := s.Data.Store.SetAnonRead(ctx, store.AnonRead{RepoPattern: "kept/**", Enabled: true}); err != nil {
		t.Fatal(err)
	}
	// The admin commands' handle: another connection to the same file.
	admin, err := store.Open(ctx, filepath.Join(s.Data.Dir, datadir.StoreFile))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	dir := t.TempDir()
	reads := func(transport string, who *actor) bool {
		t.Helper()
		out, err := s.git(t, dir, transport, who, "kept/app", "ls-remote", "URL")
		if err == nil && !strings.Contains(out, "refs/heads/main") {
			t.Fatalf("%s: ls-remote succeeded without refs:\n%s", transport, out)
		}
		return err == nil
	}
	// warm asks twice, so that the second answer is the kept one.
	warm := func(transport string, who *actor) {
		t.Helper()
		for i := 0; i < 2; i++ {
			if !reads(transport, who) {
				t.Fatalf("%s as %q: no read access before the change", transport, who.name)
			}
		}
	}

	// Anonymous read switched off for the pattern: git:// (anonymous only).
	warm("git", anon)
	if err := admin.SetAnonRead(ctx, store.AnonRead{RepoPattern: "kept/**", Enabled: false}); err != nil {
		t.Fatal(err)
	}
	if reads("git", anon) {
		t.Error("git://: anonymous read right after it was switched off")
	}

	for _, transport := range []string{"http", "ssh"} {
		warm(transport, bob)
		if err := admin.RemoveGrant(ctx, "bob", "kept/*"); err != nil {
			t.Fatal(err)
		}
		if reads(transport, bob) {
			t.Errorf("%s: read right after the grant was revoked", transport)
		}
		if err := admin.SetGrant(ctx, store.Grant{User: "bob", RepoPattern: "kept/*", Role: "read"}); err != nil {
			t.Fatal(err)
		}
		if !reads(transport, bob) {
			t.Errorf("%s: no read right after the grant came back", transport)
		}
	}

	// A removed key is anonymous on the very next connection.
	warm("ssh", bob)
	text, err := os.ReadFile(bob.key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	key, _, _, _, err := gossh.ParseAuthorizedKey(text)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RemoveKey(ctx, gossh.FingerprintSHA256(key)); err != nil {
		t.Fatal(err)
	}
	if reads("ssh", bob) {
		t.Error("ssh: read with a key removed just before")
	}
}
