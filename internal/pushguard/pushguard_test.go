package pushguard

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"packwire/internal/pktline"
)

type fakeAncestry struct {
	types     map[string]string
	ancestor  map[[2]string]bool
	failTypes bool
}

func (f *fakeAncestry) Types(context.Context, []string) (map[string]string, error) {
	if f.failTypes {
		return nil, errors.New("cat-file died")
	}
	return f.types, nil
}

func (f *fakeAncestry) IsAncestor(_ context.Context, old, new string) (bool, error) {
	return f.ancestor[[2]string{old, new}], nil
}

func TestDecide(t *testing.T) {
	a := &fakeAncestry{
		types:    map[string]string{"c1": "commit", "c2": "commit", "c3": "commit", "t1": "tag", "m": "missing"},
		ancestor: map[[2]string]bool{{"c1", "c2"}: true},
	}
	cmds := []Command{
		{"c1", "c2", "refs/heads/main"},   // fast-forward
		{"c2", "c3", "refs/tags/v1"},      // not a fast-forward
		{"c1", "t1", "refs/meta/x"},       // to a tag object: never a fast-forward
		{"m", "c2", "refs/heads/corrupt"}, // old object missing
		{"c2", "c3", "refs/heads/free"},   // not fast-forward-only: receive-pack decides
	}
	ff := map[string]bool{"refs/heads/main": true, "refs/tags/v1": true, "refs/meta/x": true, "refs/heads/corrupt": true}
	got := Decide(context.Background(), a, cmds, ff)
	want := []string{"", ForceDenied, ForceDenied, ForceDenied, ""}
	for i := range cmds {
		if got[i].Ref != cmds[i].Ref || got[i].Reason != want[i] {
			t.Errorf("%s: %q, want %q", cmds[i].Ref, got[i].Reason, want[i])
		}
	}
	a.failTypes = true
	for _, r := range Decide(context.Background(), a, cmds[:1], ff) {
		if !strings.Contains(r.Reason, "could not check") {
			t.Errorf("a failing check must refuse: %+v", r)
		}
	}
}

// TestRunHookWithoutRules: a hook that cannot read its list refuses every
// command it was given (fail closed), in the proc-receive protocol.
func TestRunHookWithoutRules(t *testing.T) {
	t.Setenv(EnvFFOnly, filepath.Join(t.TempDir(), "missing"))
	var in bytes.Buffer
	pktline.Write(&in, []byte("version=1\x00atomic\n"))
	pktline.WriteFlush(&in)
	pktline.Write(&in, []byte("1111111111111111111111111111111111111111 2222222222222222222222222222222222222222 refs/heads/main\n"))
	pktline.WriteFlush(&in)
	var out, errOut bytes.Buffer
	if code := RunHook(&in, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "version=1") || !strings.Contains(out.String(), "ng refs/heads/main packwire could not read its push rules") {
		t.Fatalf("hook answer: %q", out.String())
	}
}

func TestInstallHook(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "hooks")
	for _, exe := range []string{"/bin/true", "/bin/true", "/bin/false"} {
		if err := InstallHook(dir, exe); err != nil {
			t.Fatal(err)
		}
		if target, _ := os.Readlink(filepath.Join(dir, HookName)); target != exe {
			t.Fatalf("hook points at %q, want %q", target, exe)
		}
	}
}
