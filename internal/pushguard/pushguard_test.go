package pushguard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
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

// TestGitAncestry: the short walk and merge-base agree with git on a real
// repository: linear history, a merge, an unrelated root, a tag object, a
// missing id, and a walk budget too small to decide.
func TestGitAncestry(t *testing.T) {
	dir := t.TempDir()
	git := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir, "GIT_AUTHOR_NAME=a", "GIT_AUTHOR_EMAIL=a@b", "GIT_COMMITTER_NAME=a", "GIT_COMMITTER_EMAIL=a@b")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("git %v: %v", args, err)
		}
		return strings.TrimSpace(string(out))
	}
	git("init", "-q", "-b", "main")
	var line []string
	for i := 0; i < 8; i++ {
		git("commit", "-q", "--allow-empty", "-m", fmt.Sprint(i))
		line = append(line, git("rev-parse", "HEAD"))
	}
	git("checkout", "-q", "-b", "side", line[3])
	git("commit", "-q", "--allow-empty", "-m", "side")
	side := git("rev-parse", "HEAD")
	git("checkout", "-q", "main")
	git("merge", "-q", "--no-ff", "-m", "merge", "side")
	merge := git("rev-parse", "HEAD")
	git("checkout", "-q", "--orphan", "other")
	git("commit", "-q", "--allow-empty", "-m", "root")
	root := git("rev-parse", "HEAD")
	git("tag", "-a", "-m", "t", "v1", line[7])
	tag := git("rev-parse", "v1")
	t.Chdir(dir)
	cases := []struct {
		old, new string
		want     bool
		budget   int
	}{
		{line[0], line[7], true, 0},
		{line[6], line[7], true, 0},
		{side, merge, true, 0},
		{line[7], line[0], false, 0},
		{root, merge, false, 0},
		{line[0], line[7], true, 2}, // budget too small: merge-base decides
		{root, line[7], false, 2},
	}
	for _, c := range cases {
		a := &GitAncestry{WalkBudget: c.budget}
		got, err := a.IsAncestor(context.Background(), c.old, c.new)
		a.Close()
		if err != nil || got != c.want {
			t.Errorf("%s..%s budget %d: %v %v, want %v", c.old[:7], c.new[:7], c.budget, got, err, c.want)
		}
	}
	a := &GitAncestry{}
	defer a.Close()
	types, err := a.Types(context.Background(), []string{line[0], tag, "3333333333333333333333333333333333333333"})
	if err != nil || types[line[0]] != "commit" || types[tag] != "tag" || types["3333333333333333333333333333333333333333"] != "missing" {
		t.Fatalf("types %v %v", types, err)
	}
}
