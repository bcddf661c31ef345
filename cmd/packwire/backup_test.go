package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"packwire/internal/backup"
	"packwire/internal/gittest"
	"packwire/internal/server"
	"packwire/internal/servertest"
)

// refValues is every value each ref of a repository held: before the test,
// or pushed by it.
type refValues map[string]map[string]bool

func (v refValues) add(ref, id string) {
	if v[ref] == nil {
		v[ref] = map[string]bool{}
	}
	v[ref][id] = true
}

// refsOf reads a repository's refs: name -> object id.
func refsOf(t *testing.T, env *gittest.Env, dir string) map[string]string {
	t.Helper()
	refs := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(env.Git(dir, "for-each-ref", "--format=%(refname) %(objectname)")), "\n") {
		if name, id, ok := strings.Cut(line, " "); ok {
			refs[name] = id
		}
	}
	return refs
}

// TestBackupWhilePushing takes a backup while three clients push over HTTP
// as fast as they can (each pushes 3 times before it starts and 3 times
// after it ends, at least), restores it into a new data directory and serves it:
// every ref in the backup holds a value it really held (a consistent past
// state), every object those refs reach is there (git fsck --full), clones
// work over HTTP and SSH, the SSH host keys are the same, and the users'
// old token and SSH key still push.
func TestBackupWhilePushing(t *testing.T) {
	t.Parallel()
	s := servertest.Start(t, nil)
	env := s.Env
	ctx := context.Background()
	token := s.Token(t, "alice", "write")
	key, err := readKeyFile(s.SSHKey + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Data.Store.AddKey(ctx, "alice", key); err != nil {
		t.Fatal(err)
	}
	repos := []string{"team/a", "team/b"}
	for i, name := range repos {
		s.Repo(t, name, gittest.Shape{Commits: 30, Files: 30, BlobBytes: 4000, Branches: 2, Tags: 3, Seed: uint64(i)})
	}
	if _, err := s.Data.Repos.Create(ctx, "empty/c"); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	held, initial := map[string]refValues{}, map[string]bool{}
	for _, name := range repos {
		held[name] = refValues{}
		for ref, id := range refsOf(t, env, s.Data.Repos.PathFor(name)) {
			held[name].add(ref, id)
			initial[id] = true
		}
	}

	// Three pushers: two on team/a (own branches, one also moving main),
	// one on team/b. A ref's value is noted before its push is sent.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	pushes := make([]int, 3)
	for i := range 3 {
		name := repos[i/2]
		w := filepath.Join(t.TempDir(), "w")
		env.Git("", "clone", "-q", authURL(s, token, name), w)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				f := fmt.Sprintf("p%d-%d.txt", i, n)
				os.WriteFile(filepath.Join(w, f), []byte(strings.Repeat(f+" pushed\n", 400)), 0o644)
				if out, err := env.Run(w, nil, "add", f); err != nil {
					t.Errorf("add: %v %s", err, out)
					return
				}
				if out, err := env.Run(w, nil, "commit", "-qm", f); err != nil {
					t.Errorf("commit: %v %s", err, out)
					return
				}
				id := env.RevParse(w, "HEAD")
				refspecs := []string{fmt.Sprintf("HEAD:refs/heads/p%d", i)}
				if i == 0 {
					refspecs = append(refspecs, "HEAD:refs/heads/main")
				}
				mu.Lock()
				for _, rs := range refspecs {
					held[name].add(strings.TrimPrefix(rs, "HEAD:"), id)
				}
				mu.Unlock()
				if out, err := env.Run(w, nil, append([]string{"push", "-q", "origin"}, refspecs...)...); err != nil {
					t.Errorf("push %d of pusher %d: %v\n%s", n, i, err, out)
					return
				}
				mu.Lock()
				pushes[i]++
				mu.Unlock()
			}
		}()
	}
	// Each pusher pushes at least `more` times more than it had (bounded
	// in time: a loaded machine pushes slower, never fewer times).
	waitPushes := func(more int) []int {
		mu.Lock()
		from := append([]int(nil), pushes...)
		mu.Unlock()
		deadline := time.Now().Add(60 * time.Second)
		for {
			mu.Lock()
			done := true
			for i := range pushes {
				done = done && pushes[i] >= from[i]+more
			}
			now := append([]int(nil), pushes...)
			mu.Unlock()
			if done || t.Failed() {
				return now
			}
			if time.Now().After(deadline) {
				t.Fatalf("pushes stalled: %v", now)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	before := waitPushes(3)
	out := filepath.Join(t.TempDir(), "backup")
	start := time.Now()
	backupOut, code := packwire(t, "backup", "--data", s.Data.Dir, out)
	took := time.Since(start)
	after := waitPushes(3)
	close(stop)
	wg.Wait()
	if code != 0 {
		t.Fatalf("backup: %d\n%s", code, backupOut)
	}
	t.Logf("backup took %s; pushes by pusher: %v before it, %v after\n%s", took.Round(time.Millisecond), before, after, backupOut)
	if t.Failed() {
		return
	}

	m, err := backup.ReadManifest(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Repositories) != 3 || m.Repositories[0].Name != "empty/c" || m.Repositories[0].Refs != 0 ||
		m.Repositories[0].Head != "ref: refs/heads/main" || strings.Join(m.Files, " ") != "packwire.db ssh_host_ecdsa_key ssh_host_ed25519_key ssh_host_rsa_key lfs/lfs.db" {
		t.Fatalf("manifest: %+v", m)
	}
	backedUp, pushedInBackup := map[string]map[string]string{}, 0
	for _, e := range m.Repositories[1:] {
		dir := filepath.Join(out, "repos", e.Name+".git")
		env.Fsck(dir)
		refs := refsOf(t, env, dir)
		if len(refs) != e.Refs {
			t.Fatalf("%s: %d refs, manifest says %d", e.Name, len(refs), e.Refs)
		}
		for ref, id := range refs {
			if !held[e.Name][ref][id] {
				t.Fatalf("%s: %s is %s in the backup, a value it never held", e.Name, ref, id)
			}
			if !initial[id] {
				pushedInBackup++
			}
		}
		backedUp[e.Name] = refs
	}
	if pushedInBackup == 0 {
		t.Fatal("the backup holds none of the pushes made before it")
	}

	restored := filepath.Join(t.TempDir(), "restored")
	if out, code := packwire(t, "restore", out, "--data", s.Data.Dir); code == 0 || !strings.Contains(out, "not empty") {
		t.Fatalf("restore over a data directory in use: %d\n%s", code, out)
	}
	if out, code := packwire(t, "restore", out, "--data", restored); code != 0 {
		t.Fatalf("restore: %d\n%s", code, out)
	}
	s2 := servertest.Start(t, func(c *server.Config) { c.DataDir = restored })
	if s2.HostKeyFingerprint() != s.HostKeyFingerprint() {
		t.Fatalf("host key %s after restore, was %s", s2.HostKeyFingerprint(), s.HostKeyFingerprint())
	}
	sshEnv := []string{gittest.SSHCommandEnv(s.SSHKey)}
	for name, refs := range backedUp {
		env.Fsck(s2.Data.Repos.PathFor(name))
		for _, url := range []string{s2.HTTPURL(name), s2.SSHURL(name)} {
			c := filepath.Join(t.TempDir(), "c")
			if out, err := env.Run("", sshEnv, "clone", "-q", "--mirror", url, c); err != nil {
				t.Fatalf("clone %s: %v\n%s", url, err, out)
			}
			if got := refsOf(t, env, c); fmt.Sprint(got) != fmt.Sprint(refs) {
				t.Fatalf("clone %s: refs %v, backup %v", url, got, refs)
			}
			env.Fsck(c)
		}
	}
	c := filepath.Join(t.TempDir(), "empty")
	env.Git("", "clone", "-q", s2.HTTPURL("empty/c"), c)

	// The old token pushes over HTTP, the old key over SSH: both still
	// authenticate as alice, who may write.
	w := filepath.Join(t.TempDir(), "w2")
	env.Git("", "clone", "-q", authURL(s2, token, "team/a"), w)
	for i, url := range []string{authURL(s2, token, "team/a"), s2.SSHURL("team/a")} {
		env.Git(w, "commit", "-q", "--allow-empty", "-m", fmt.Sprintf("after restore %d", i))
		if out, err := env.Run(w, sshEnv, "push", "-q", url, "HEAD:refs/heads/restored"); err != nil {
			t.Fatalf("push to the restored server via %s: %v\n%s", url, err, out)
		}
	}
	if got := env.RevParse(s2.Data.Repos.PathFor("team/a"), "refs/heads/restored"); got != env.RevParse(w, "HEAD") {
		t.Fatalf("restored server's branch at %s, pushed %s", got, env.RevParse(w, "HEAD"))
	}
}

// TestBackupRefusals: backup never creates a data directory or writes into
// a non-empty OUT; restore wants a backup.
func TestBackupRefusals(t *testing.T) {
	tmp := t.TempDir()
	missing := filepath.Join(tmp, "nothing")
	if out, code := packwire(t, "backup", "--data", missing, filepath.Join(tmp, "out")); code != 2 || !strings.Contains(out, "no packwire data in") {
		t.Fatalf("backup of no data: %d\n%s", code, out)
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Fatal("backup created the data directory")
	}
	data := makeData(t)
	if out, code := packwire(t, "repo", "create", "app", "--data", data); code != 0 {
		t.Fatal(out)
	}
	full := filepath.Join(tmp, "full")
	os.MkdirAll(full, 0o755)
	os.WriteFile(filepath.Join(full, "x"), nil, 0o644)
	if out, code := packwire(t, "backup", "--data", data, full); code != 1 || !strings.Contains(out, "is not empty") {
		t.Fatalf("backup into a non-empty directory: %d\n%s", code, out)
	}
	if out, code := packwire(t, "restore", data, "--data", filepath.Join(tmp, "new")); code != 1 || !strings.Contains(out, "not a packwire backup") {
		t.Fatalf("restore of a data directory: %d\n%s", code, out)
	}
	if out, code := packwire(t, "backup", "--help"); code != 0 || !strings.Contains(out, "usage: packwire backup") {
		t.Fatalf("backup --help: %d\n%s", code, out)
	}
	// Nothing half-written is left beside the targets.
	entries, _ := os.ReadDir(tmp)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Fatalf("left behind: %s", e.Name())
		}
	}
}
