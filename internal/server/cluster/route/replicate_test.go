package route

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"packwire/internal/access"
	"packwire/internal/gittest"
	"packwire/internal/repo"
	"packwire/internal/server/cluster"
)

// replication is a primary (a work repository whose refs move only when
// the test says, as git's do after the hook) and a replica served by
// ReplicateHandler over HTTP on 127.0.0.1.
type replication struct {
	t       *testing.T
	env     *gittest.Env
	work    string // the primary's repository (with a work tree, to make commits)
	replica repo.Repo
	rt      *Router
	h       *Replicator
	url     string
	n       int
}

const testSecret = "cluster-secret"

func newReplication(t *testing.T) *replication {
	env := gittest.New(t)
	t.Setenv("HOME", env.Home)
	t.Setenv("GIT_CONFIG_NOSYSTEM", "1")
	root := repo.Root{Dir: t.TempDir()}
	replica, err := root.Create(context.Background(), "app")
	if err != nil {
		t.Fatal(err)
	}
	h := ReplicateHandler(root, &access.Controller{ClusterSecret: testSecret}, 0)
	srv := httptest.NewServer(h)
	t.Cleanup(h.Close)
	t.Cleanup(srv.Close)
	work := filepath.Join(t.TempDir(), "work")
	env.Git("", "init", "-q", work)
	return &replication{t: t, env: env, work: work, replica: replica, rt: &Router{Secret: testSecret}, h: h, url: srv.URL}
}

// commit makes a commit on parent ("" for a root) without moving a ref.
func (r *replication) commit(parent string) string {
	r.t.Helper()
	r.n++
	os.WriteFile(filepath.Join(r.work, fmt.Sprintf("f%d.txt", r.n%3)), []byte(strings.Repeat(fmt.Sprintf("%d\n", r.n), 50)), 0o644)
	r.env.Git(r.work, "add", ".")
	tree := strings.TrimSpace(r.env.Git(r.work, "write-tree"))
	args := []string{"commit-tree", "-m", fmt.Sprint(r.n), tree}
	if parent != "" {
		args = append(args, "-p", parent)
	}
	return strings.TrimSpace(r.env.Git(r.work, args...))
}

// tag makes an annotated tag object of id without a ref.
func (r *replication) tag(id, name string) string {
	r.t.Helper()
	body := fmt.Sprintf("object %s\ntype commit\ntag %s\ntagger T <t@example.com> 1700000000 +0000\n\nrelease\n", id, name)
	f := filepath.Join(r.t.TempDir(), "tag")
	os.WriteFile(f, []byte(body), 0o644)
	return strings.TrimSpace(r.env.Git(r.work, "hash-object", "-t", "tag", "-w", f))
}

// send replicates updates as the primary does (the pack made before its
// refs move); then the primary's refs move.
func (r *replication) send(updates ...cluster.Update) error {
	r.t.Helper()
	primary := repo.Repo{Name: "app", Path: filepath.Join(r.work, ".git")}
	pack, err := packFor(context.Background(), primary, updates)
	if err != nil {
		r.t.Fatal(err)
	}
	defer pack.Close()
	pk := &packing{done: make(chan struct{}), pack: pack}
	close(pk.done)
	// From the primary's refs: the replica must have them first.
	before, err := cluster.CopyDigest(filepath.Join(r.work, ".git"))
	if err != nil {
		r.t.Fatal(err)
	}
	digest, err := r.rt.sendTo(context.Background(), r.url, "app", before, updates, pk)
	if err == nil {
		for _, u := range updates {
			if cluster.IsZero(u.New) {
				r.env.Git(r.work, "update-ref", "-d", u.Ref)
			} else {
				r.env.Git(r.work, "update-ref", u.Ref, u.New)
			}
		}
		// The replica answers the digest of its refs once written: the
		// primary's, now.
		if want, err := cluster.CopyDigest(filepath.Join(r.work, ".git")); err != nil || digest != want {
			r.t.Fatalf("the replica answered digest %q, the primary's refs have %q (%v)", digest, want, err)
		}
	}
	return err
}

func (r *replication) refs(dir string) string {
	return r.env.Git(dir, "for-each-ref", "--format=%(objectname) %(refname)")
}

// same checks that the replica holds exactly the primary's refs and is
// fsck-clean.
func (r *replication) same() {
	r.t.Helper()
	if got, want := r.refs(r.replica.Path), r.refs(r.work); got != want {
		r.t.Fatalf("replica's refs:\n%s\nprimary's:\n%s", got, want)
	}
	r.env.Fsck(r.replica.Path)
	r.noLeftovers()
}

// noLeftovers: no quarantine or temporary pack left in the replica, but
// the empty quarantine of the processes started for the next replication.
// A replication's own quarantine is removed once it answered: waited for,
// up to 30 s (its kit's git processes exit first; 5 s was too short at a
// load average of 40 on 2 cores, TestReplicateCreatesUpdatesDeletesAndTags
// and TestReplicateSendsTheKeptPack failed so).
func (r *replication) noLeftovers() {
	r.t.Helper()
	var left []string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		left = left[:0]
		r.h.kits.mu.Lock()
		kit := r.h.kits.kits[r.replica.Path]
		r.h.kits.mu.Unlock()
		for _, pattern := range []string{"objects/incoming-*", "objects/pack/tmp_*", "objects/tmp_*"} {
			m, _ := filepath.Glob(filepath.Join(r.replica.Path, pattern))
			for _, f := range m {
				if kit != nil && f == kit.quarantine {
					if files, _ := filepath.Glob(filepath.Join(f, "pack", "*")); len(files) == 0 {
						continue
					}
				}
				left = append(left, f)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(left) > 0 {
		r.t.Fatalf("left in the replica: %v", left)
	}
}

const zero = "0000000000000000000000000000000000000000"

// TestReplicateCreatesUpdatesDeletesAndTags: new refs, a fast-forward, a
// forced update, an annotated tag and deletes, each one transaction, and
// the replica equal to the primary and fsck-clean after each.
func TestReplicateCreatesUpdatesDeletesAndTags(t *testing.T) {
	r := newReplication(t)
	c1 := r.commit("")
	if err := r.send(cluster.Update{Old: zero, New: c1, Ref: "refs/heads/main"}); err != nil {
		t.Fatal(err)
	}
	r.same()
	if head := strings.TrimSpace(r.env.Git(r.replica.Path, "symbolic-ref", "HEAD")); head != "refs/heads/main" {
		t.Fatalf("replica's HEAD %s", head)
	}
	c2 := r.commit(c1)
	c3 := r.commit(c2)
	tag := r.tag(c2, "v1")
	if err := r.send(cluster.Update{Old: c1, New: c3, Ref: "refs/heads/main"},
		cluster.Update{Old: zero, New: c2, Ref: "refs/heads/topic"},
		cluster.Update{Old: zero, New: tag, Ref: "refs/tags/v1"}); err != nil {
		t.Fatal(err)
	}
	r.same()
	// A forced update (not a descendant) and a delete, together.
	c4 := r.commit(c1)
	if err := r.send(cluster.Update{Old: c3, New: c4, Ref: "refs/heads/main"},
		cluster.Update{Old: c2, New: zero, Ref: "refs/heads/topic"}); err != nil {
		t.Fatal(err)
	}
	r.same()
	// Objects the replica has already, under a new name: no pack at all.
	if err := r.send(cluster.Update{Old: zero, New: c3, Ref: "refs/heads/old"}); err != nil {
		t.Fatal(err)
	}
	r.same()
}

// TestReplicateRefusesAnotherState: a replica whose ref is not at the old
// value refuses the whole transaction; nothing changes there.
func TestReplicateRefusesAnotherState(t *testing.T) {
	r := newReplication(t)
	c1 := r.commit("")
	if err := r.send(cluster.Update{Old: zero, New: c1, Ref: "refs/heads/main"}); err != nil {
		t.Fatal(err)
	}
	before := r.refs(r.replica.Path)
	c2 := r.commit(c1)
	other := r.commit(c1)
	// main is at c1 on the replica, the update says it was at other; the
	// new branch in the same transaction must not be written either.
	err := r.send(cluster.Update{Old: other, New: c2, Ref: "refs/heads/main"},
		cluster.Update{Old: zero, New: c2, Ref: "refs/heads/new"})
	if !errors.Is(err, errConflict) {
		t.Fatalf("update from another state: %v, want a 409 refusal", err)
	}
	// A ref the replica has that the update says is new.
	err2 := r.send(cluster.Update{Old: zero, New: c2, Ref: "refs/heads/main"})
	if err2 == nil {
		t.Fatal("creating a ref the replica has was accepted")
	}
	if after := r.refs(r.replica.Path); after != before {
		t.Fatalf("refused updates changed the replica's refs:\n%s\nwas:\n%s", after, before)
	}
	r.env.Fsck(r.replica.Path)
	r.noLeftovers()
}

// TestReplicateRefusesADeposedPrimary: a replication from the refs of an
// older generation is refused, even when each update's old value holds
// (a new branch): the replication of a primary deposed mid-push, held up
// by a partition, landed after the new primary's pushes and left every
// copy off the generation's refs (issue 29, bench/chaos partition).
func TestReplicateRefusesADeposedPrimary(t *testing.T) {
	r := newReplication(t)
	c1 := r.commit("")
	if err := r.send(cluster.Update{Old: zero, New: c1, Ref: "refs/heads/main"}); err != nil {
		t.Fatal(err)
	}
	// The new primary's push, which the old one never saw.
	later := r.commit(c1)
	if err := r.send(cluster.Update{Old: zero, New: later, Ref: "refs/heads/later"}); err != nil {
		t.Fatal(err)
	}
	r.env.Git(r.work, "update-ref", "-d", "refs/heads/later")
	before := r.refs(r.replica.Path)
	stale := r.commit(c1)
	err := r.send(cluster.Update{Old: zero, New: stale, Ref: "refs/heads/stale"})
	if !errors.Is(err, errConflict) {
		t.Fatalf("replication from an older generation's refs: %v, want a 409 refusal", err)
	}
	if after := r.refs(r.replica.Path); after != before {
		t.Fatalf("the refused replication changed the replica's refs:\n%s\nwas:\n%s", after, before)
	}
	r.env.Fsck(r.replica.Path)
	r.noLeftovers()
}

// TestReplicateTruncatedPack: a pack cut short (the primary died while
// sending) is refused; no ref is written and nothing is left behind.
func TestReplicateTruncatedPack(t *testing.T) {
	r := newReplication(t)
	c1 := r.commit("")
	if err := r.send(cluster.Update{Old: zero, New: c1, Ref: "refs/heads/main"}); err != nil {
		t.Fatal(err)
	}
	before := r.refs(r.replica.Path)
	c2 := r.commit(c1)
	updates := []cluster.Update{{Old: c1, New: c2, Ref: "refs/heads/main"}, {Old: zero, New: c2, Ref: "refs/heads/b"}}
	pack, err := packFor(context.Background(), repo.Repo{Name: "app", Path: filepath.Join(r.work, ".git")}, updates)
	if err != nil || pack == nil {
		t.Fatalf("pack: %v", err)
	}
	defer pack.Close()
	body, size := wireBody(updates, pack)
	whole, err := io.ReadAll(body)
	if err != nil || int64(len(whole)) != size {
		t.Fatalf("body: %d bytes of %d: %v", len(whole), size, err)
	}
	post := func(b []byte) int {
		req, _ := http.NewRequest(http.MethodPost, r.url+ReplicatePath, bytes.NewReader(b))
		req.Header.Set(hdrReplicaRepo, "app")
		req.SetBasicAuth(access.ClusterUser, testSecret)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	headLen := int64(bytes.Index(whole, []byte("\npack ")) + 1)
	packAt := headLen + int64(bytes.IndexByte(whole[headLen:], '\n')) + 1
	damaged := append([]byte{}, whole...)
	damaged[packAt+20] ^= 0xff // a byte of the pack's objects
	// Whole and checksummed, but named as another pack: it could replace
	// that pack on the replica.
	misnamed := append([]byte{}, whole...)
	nameAt := headLen + int64(len("pack "))
	copy(misnamed[nameAt:], strings.Repeat("a", len(pack.name)))
	// An update line that never ends, past the reader's buffer.
	endless := append([]byte(zero+" "+c2+" refs/heads/"), bytes.Repeat([]byte("x"), 128<<10)...)
	for what, b := range map[string][]byte{
		"misnamed":          misnamed,
		"endless line":      endless,
		"cut in the index":  whole[:size-1],
		"cut in the pack":   whole[:packAt+pack.packSize/2],
		"cut in the header": whole[:headLen+30],
		"damaged":           damaged,
	} {
		if code := post(b); code == http.StatusOK {
			t.Fatalf("a pack %s was accepted", what)
		}
		if after := r.refs(r.replica.Path); after != before {
			t.Fatalf("a pack %s changed the refs:\n%s", what, after)
		}
		r.noLeftovers()
	}
	r.env.Fsck(r.replica.Path)
	// The whole body goes through.
	if code := post(whole); code != http.StatusOK {
		t.Fatalf("the whole pack: %d", code)
	}
}

// TestReplicateNeedsTheClusterSecret: the endpoint answers 401 to a
// request without the cluster user's credentials, or with a wrong secret,
// and changes nothing.
func TestReplicateNeedsTheClusterSecret(t *testing.T) {
	r := newReplication(t)
	c1 := r.commit("")
	body := zero + " " + c1 + " refs/heads/main\n\n"
	for _, auth := range []struct{ user, pass string }{{"", ""}, {access.ClusterUser, "wrong"}, {"alice", testSecret}} {
		req, _ := http.NewRequest(http.MethodPost, r.url+ReplicatePath, strings.NewReader(body))
		req.Header.Set(hdrReplicaRepo, "app")
		if auth.user != "" {
			req.SetBasicAuth(auth.user, auth.pass)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("user %q: %s, want 401", auth.user, resp.Status)
		}
	}
	if refs := r.refs(r.replica.Path); refs != "" {
		t.Fatalf("refs written without credentials:\n%s", refs)
	}
}

// TestReplicateSendsTheKeptPack: the pack receive-pack kept for a push
// (its .keep names receive-pack's pid, the hook's parent) is what the
// replicas get, as it is; another process's kept pack is not taken.
func TestReplicateSendsTheKeptPack(t *testing.T) {
	r := newReplication(t)
	c1 := r.commit("")
	if err := r.send(cluster.Update{Old: zero, New: c1, Ref: "refs/heads/main"}); err != nil {
		t.Fatal(err)
	}
	c2 := r.commit(c1)
	gitDir := filepath.Join(r.work, ".git")
	packFile := filepath.Join(t.TempDir(), "p.pack")
	// The client's thin pack, kept as receive-pack keeps it.
	cmd := fmt.Sprintf("printf '%%s\\n^%%s\\n' %s %s | git pack-objects --revs --thin --stdout -q > %s && git index-pack --stdin --fix-thin --keep='receive-pack 4242 on host' < %s",
		c2, c1, packFile, packFile)
	if b, err := exec.Command("sh", "-c", "cd "+gitDir+" && "+cmd).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	push := []cluster.Update{{Old: c1, New: c2, Ref: "refs/heads/main"}}
	if p, err := keptPack(gitDir, "4243", push); p != nil || err != nil {
		t.Fatalf("another receive-pack's pack taken: %v %v", p, err)
	}
	// The pid given again to a later receive-pack, whose push is another.
	if p, err := keptPack(gitDir, "4242", []cluster.Update{{Old: c1, New: r.commit(c1), Ref: "refs/heads/main"}}); p != nil || err != nil {
		t.Fatalf("a kept pack without the push's objects taken: %v %v", p, err)
	}
	p, err := keptPack(gitDir, "4242", push)
	if p == nil || err != nil {
		t.Fatalf("kept pack not found: %v", err)
	}
	defer p.Close()
	pk := &packing{done: make(chan struct{}), pack: p}
	close(pk.done)
	if _, err := r.rt.sendTo(context.Background(), r.url, "app", "", []cluster.Update{{Old: c1, New: c2, Ref: "refs/heads/main"}}, pk); err != nil {
		t.Fatal(err)
	}
	r.env.Git(r.work, "update-ref", "refs/heads/main", c2)
	r.same()
	if _, err := os.Stat(filepath.Join(r.replica.Path, "objects", "pack", "pack-"+p.name+".pack")); err != nil {
		t.Fatalf("the replica does not hold the kept pack as it is: %v", err)
	}
}

// waitKit waits until the replica's processes for the next replication
// are started (warm.go) and returns how many kits were taken so far.
func (r *replication) waitKit() int {
	r.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		r.h.kits.mu.Lock()
		k, used := r.h.kits.kits[r.replica.Path], r.h.kits.used
		r.h.kits.mu.Unlock()
		if k != nil {
			return used
		}
	}
	r.t.Fatal("no kit started after a replication")
	return 0
}

func (r *replication) kitsUsed() int {
	r.h.kits.mu.Lock()
	defer r.h.kits.mu.Unlock()
	return r.h.kits.used
}

// TestReplicateWithProcessesStartedAhead: a replication served by git
// processes started before it came sees the copy as it is when it comes,
// not as it was when they started: refs moved since (a catch-up, say) are
// compared at their new values, objects that arrived since count, and
// objects that are missing are still refused, leaving nothing changed.
func TestReplicateWithProcessesStartedAhead(t *testing.T) {
	r := newReplication(t)
	c1 := r.commit("")
	if err := r.send(cluster.Update{Old: zero, New: c1, Ref: "refs/heads/main"}); err != nil {
		t.Fatal(err)
	}
	used := r.waitKit()
	// After the kit started: main moves on the replica (and the
	// primary) by another way, with objects of its own.
	c2 := r.commit(c1)
	r.env.Git(r.work, "update-ref", "refs/heads/main", c2)
	r.env.Git(r.replica.Path, "fetch", "-q", r.work, "+refs/heads/main:refs/heads/main")
	r.same()
	// An update from the value main had when the kit started is refused.
	c3 := r.commit(c2)
	if err := r.send(cluster.Update{Old: c1, New: c3, Ref: "refs/heads/main"}); !errors.Is(err, errConflict) {
		t.Fatalf("an update from an old value: %v, want a 409 refusal", err)
	}
	if r.kitsUsed() != used+1 {
		t.Fatalf("the started processes were not used (%d kits taken, was %d)", r.kitsUsed(), used)
	}
	r.noLeftovers()
	// From the current one it is taken, with objects that came after
	// the kit (c2's, fetched) completing c3's.
	used = r.waitKit()
	if err := r.send(cluster.Update{Old: c2, New: c3, Ref: "refs/heads/main"}); err != nil {
		t.Fatal(err)
	}
	if r.kitsUsed() != used+1 {
		t.Fatal("the started processes were not used")
	}
	r.same()
	// A pack that lacks objects of the new value (its commit alone, not
	// its tree): refused, no ref written.
	used = r.waitKit()
	c4 := r.commit(c3)
	dir := t.TempDir()
	cmd := exec.Command("git", "-C", r.work, "pack-objects", "-q", filepath.Join(dir, "pack"))
	cmd.Env = append(os.Environ(), "HOME="+r.env.Home)
	cmd.Stdin = strings.NewReader(c4 + "\n")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	p := &packed{name: strings.TrimSpace(string(out))}
	base := filepath.Join(dir, "pack-"+p.name)
	if p.pack, p.packSize, err = openSized(base + ".pack"); err != nil {
		t.Fatal(err)
	}
	if p.idx, p.idxSize, err = openSized(base + ".idx"); err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	pk := &packing{done: make(chan struct{}), pack: p}
	close(pk.done)
	before := r.refs(r.replica.Path)
	_, err = r.rt.sendTo(context.Background(), r.url, "app", "", []cluster.Update{{Old: c3, New: c4, Ref: "refs/heads/main"}}, pk)
	if err == nil || !strings.Contains(err.Error(), "missing objects") {
		t.Fatalf("a pack without the new value's tree: %v, want a refusal for missing objects", err)
	}
	if r.kitsUsed() != used+1 {
		t.Fatal("the started processes were not used")
	}
	if after := r.refs(r.replica.Path); after != before {
		t.Fatalf("an incomplete pack changed the refs:\n%s", after)
	}
	r.noLeftovers()
}

// TestReplicateSkipsProcessesOfAnotherRepository: processes started for
// the repository at a path are not used for another one put there since
// (they read the old one's config when they started).
func TestReplicateSkipsProcessesOfAnotherRepository(t *testing.T) {
	r := newReplication(t)
	c1 := r.commit("")
	if err := r.send(cluster.Update{Old: zero, New: c1, Ref: "refs/heads/main"}); err != nil {
		t.Fatal(err)
	}
	used := r.waitKit()
	if err := os.Rename(r.replica.Path, r.replica.Path+".old"); err != nil {
		t.Fatal(err)
	}
	r.env.Git("", "init", "-q", "--bare", r.replica.Path)
	r.env.Git(r.work, "update-ref", "-d", "refs/heads/main")
	if err := r.send(cluster.Update{Old: zero, New: c1, Ref: "refs/heads/main"}); err != nil {
		t.Fatal(err)
	}
	if r.kitsUsed() != used {
		t.Fatal("processes started in the repository moved away were used for the new one")
	}
	r.same()
}

// TestReplicateQuarantineMadeAhead: the processes started for the next
// replication come with its quarantine made (off its path), a replication
// whose quarantine went meanwhile (maintenance removes old ones) makes it
// again, and the emptied quarantine serves the next replication.
func TestReplicateQuarantineMadeAhead(t *testing.T) {
	r := newReplication(t)
	c1 := r.commit("")
	if err := r.send(cluster.Update{Old: zero, New: c1, Ref: "refs/heads/main"}); err != nil {
		t.Fatal(err)
	}
	used := r.waitKit()
	r.h.kits.mu.Lock()
	q := r.h.kits.kits[r.replica.Path].quarantine
	r.h.kits.mu.Unlock()
	if info, err := os.Stat(filepath.Join(q, "pack")); err != nil || !info.IsDir() {
		t.Fatalf("the next replication's quarantine was not made ahead: %v", err)
	}
	os.RemoveAll(q)
	c2 := r.commit(c1)
	if err := r.send(cluster.Update{Old: c1, New: c2, Ref: "refs/heads/main"}); err != nil {
		t.Fatalf("a replication whose quarantine went: %v", err)
	}
	if r.kitsUsed() != used+1 {
		t.Fatal("the started processes were not used")
	}
	r.same()
	// The replication's quarantine, emptied, is the next one's.
	r.waitKit()
	r.h.kits.mu.Lock()
	next := r.h.kits.kits[r.replica.Path].quarantine
	r.h.kits.mu.Unlock()
	if next != q {
		t.Fatalf("the next replication's quarantine is %s, not the emptied %s", next, q)
	}
}
