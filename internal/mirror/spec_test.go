package mirror

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"packwire/internal/repo"
)

// TestApplySpec: a copy made to a Spec reads back as it (config and
// credentials), push mirrors removed from the Spec leave the copy with
// their credentials, and a Spec without a pull mirror makes the copy
// writable again.
func TestApplySpec(t *testing.T) {
	ctx := context.Background()
	root := repo.Root{Dir: t.TempDir()}
	r, err := root.Create(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	pull, _, err := NewPullSpec("https://bob:s3cret-token@example.com/src.git", "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	spec := Spec{Pull: &pull}
	spec, pm, err := spec.WithPush("https://example.org/one.git", "push-token-1")
	if err != nil || pm.ID != 1 {
		t.Fatal(pm, err)
	}
	spec, _, _ = spec.WithPush("/srv/two.git", "")
	if err := ApplySpec(ctx, r, spec); err != nil {
		t.Fatal(err)
	}
	got, err := SpecOf(r)
	if err != nil || got.Encode() != spec.Encode() {
		t.Fatalf("read back %s (%v), want %s", got.Encode(), err, spec.Encode())
	}
	if ReadOnlyRefusal(r) == "" {
		t.Fatal("a pull mirror's copy takes pushes")
	}
	cfg, _ := os.ReadFile(filepath.Join(r.Path, "config"))
	if strings.Contains(string(cfg), "s3cret") || strings.Contains(string(cfg), "push-token") {
		t.Fatalf("credentials in the config:\n%s", cfg)
	}

	spec, _, err = spec.WithoutPush("app", 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := spec.WithoutPush("app", 9); err == nil {
		t.Fatal("removing a push mirror that is not there")
	}
	spec.Pull = nil
	if err := ApplySpec(ctx, r, spec); err != nil {
		t.Fatal(err)
	}
	if got, _ := SpecOf(r); got.Encode() != spec.Encode() {
		t.Fatalf("after removals: %s, want %s", got.Encode(), spec.Encode())
	}
	if ReadOnlyRefusal(r) != "" || HasCredentials(r, PushRemotePrefix+"1") || HasCredentials(r, PullRemote) {
		t.Fatal("a removal left the copy read-only or credentials behind")
	}
}
