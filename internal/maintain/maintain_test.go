package maintain

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"packwire/internal/gittest"
	"packwire/internal/repo"
)

// AddPullRefs makes n side commits with fast-import, each on refs/pull/N/head
// off a commit of main with a file of its own, so that their objects are
// outside the closure of branches and tags.
func addPullRefs(t testing.TB, env *gittest.Env, bare string, n int) {
	t.Helper()
	base := strings.Fields(env.Git(bare, "rev-list", "main"))
	var in bytes.Buffer
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&in, "commit refs/pull/%d/head\ncommitter Test <test@example.com> 1767225600 +0000\ndata 3\npr\nfrom %s\n", i, base[i%len(base)])
		body := fmt.Sprintf("pull request %d\n%s\n", i, strings.Repeat(fmt.Sprintf("line %d\n", i), 20))
		fmt.Fprintf(&in, "M 100644 inline pr/%d.txt\ndata %d\n%s\n", i, len(body), body)
	}
	cmd := exec.Command("git", "fast-import", "--quiet")
	cmd.Dir = bare
	cmd.Env = env.Vars
	cmd.Stdin = &in
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("fast-import: %v\n%s", err, out)
	}
}

func newRepo(t *testing.T) (*gittest.Env, repo.Repo) {
	env := gittest.New(t)
	bare := filepath.Join(t.TempDir(), "app.git")
	env.Build(bare, gittest.Shape{Commits: 40, Files: 30, BlobBytes: 1500, Branches: 3, Tags: 4, Seed: 7})
	addPullRefs(t, env, bare, 60)
	// Some unreachable objects, as a force push leaves behind.
	unreachable := filepath.Join(t.TempDir(), "orphan")
	os.WriteFile(unreachable, []byte("nobody points at me\n"), 0o644)
	env.Git(bare, "hash-object", "-w", unreachable)
	return env, repo.Repo{Name: "app", Path: bare}
}

func quietMaintainer() *Maintainer {
	return New(Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
}

// packObjects lists the object ids of a pack by its index.
func packObjects(t *testing.T, env *gittest.Env, bare, pack string) []string {
	t.Helper()
	idx := filepath.Join(bare, "objects", "pack", strings.TrimSuffix(pack, ".pack")+".idx")
	f, err := os.Open(idx)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command("git", "show-index")
	cmd.Stdin = f
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		ids = append(ids, strings.Fields(line)[1])
	}
	sort.Strings(ids)
	return ids
}

// defaultClosure is what a default clone fetches, by git rev-list.
func defaultClosure(t *testing.T, env *gittest.Env, bare string) []string {
	t.Helper()
	out := env.Git(bare, "rev-list", "--objects", "--branches", "--tags", "HEAD")
	var ids []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		ids = append(ids, strings.Fields(line)[0])
	}
	sort.Strings(ids)
	return ids
}

func assertShape(t *testing.T, env *gittest.Env, r repo.Repo) *Layout {
	t.Helper()
	l, err := Inspect(r.Path)
	if err != nil {
		t.Fatal(err)
	}
	pref := l.PreferredPack()
	if pref == nil {
		t.Fatalf("no preferred pack: %+v", l)
	}
	if !l.MIDX || !l.Bitmap || !l.CommitGraph {
		t.Fatalf("midx %v bitmap %v commit-graph %v", l.MIDX, l.Bitmap, l.CommitGraph)
	}
	got, want := packObjects(t, env, r.Path, pref.Name), defaultClosure(t, env, r.Path)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("preferred pack has %d objects, the default-clone closure %d", len(got), len(want))
	}
	if _, err := os.Stat(filepath.Join(r.Path, "objects", "pack", strings.TrimSuffix(pref.Name, ".pack")+".rev")); err != nil {
		t.Fatalf("no reverse index for the preferred pack: %v", err)
	}
	// The bitmap's preferred pack is ours: git says so when asked to verify.
	out := env.Git(r.Path, "multi-pack-index", "verify")
	_ = out
	return l
}

func TestFullRunBuildsServingShape(t *testing.T) {
	t.Parallel()
	env, r := newRepo(t)
	m := quietMaintainer()
	ctx := context.Background()
	kind, reason, err := m.Plan(ctx, r.Path)
	if err != nil || kind != Full {
		t.Fatalf("plan = %q %q %v, want full", kind, reason, err)
	}
	run, err := m.Maintain(ctx, r, false)
	if err != nil {
		t.Fatal(err)
	}
	if run.Result != "ok" || run.UserCPU+run.SysCPU <= 0 || run.PacksAfter < 2 {
		t.Fatalf("run %+v", run)
	}
	l := assertShape(t, env, r)
	var cruft bool
	for _, p := range l.Packs {
		cruft = cruft || p.Cruft
	}
	if !cruft {
		t.Fatalf("unreachable objects were not kept in a cruft pack: %+v", l.Packs)
	}
	env.Fsck(r.Path)
	// Refs outside branches and tags stay fetchable by name.
	w := filepath.Join(t.TempDir(), "w")
	env.Git("", "clone", "-q", "--no-local", r.Path, w)
	env.Git(w, "fetch", "-q", "origin", "refs/pull/7/head")
	if got, want := env.RevParse(w, "FETCH_HEAD"), env.RevParse(r.Path, "refs/pull/7/head"); got != want {
		t.Fatalf("fetched %s, want %s", got, want)
	}
	env.Fsck(w)
	// Nothing more to do.
	if kind, reason, err := m.Plan(ctx, r.Path); err != nil || kind != None {
		t.Fatalf("plan after a full run = %q %q %v", kind, reason, err)
	}
}

func TestPushesFoldGeometricallyAndKeepPreferredPack(t *testing.T) {
	t.Parallel()
	env, r := newRepo(t)
	m := quietMaintainer()
	ctx := context.Background()
	if _, err := m.Maintain(ctx, r, true); err != nil {
		t.Fatal(err)
	}
	before, _ := Inspect(r.Path)
	pref := before.PreferredPack().Name
	prefSum := sha(t, filepath.Join(r.Path, "objects", "pack", pref))
	w := filepath.Join(t.TempDir(), "w")
	env.Git("", "clone", "-q", "--no-local", r.Path, w)
	for i := 0; i < 4; i++ {
		os.WriteFile(filepath.Join(w, fmt.Sprintf("new%d.txt", i)), []byte(strings.Repeat("x", i+1)), 0o644)
		env.Git(w, "add", ".")
		env.Git(w, "commit", "-qm", "new")
		// As packwire serves pushes: kept as a pack.
		env.Git(w, "-c", "receive.unpackLimit=1", "push", "-q", "--receive-pack=git -c receive.unpackLimit=1 receive-pack", "origin", "main")
	}
	mid, _ := Inspect(r.Path)
	if mid.Loose != 0 || len(mid.Packs) != len(before.Packs)+4 {
		t.Fatalf("pushes did not land as packs: %d packs (was %d), %d loose", len(mid.Packs), len(before.Packs), mid.Loose)
	}
	kind, reason, err := m.Plan(ctx, r.Path)
	if err != nil || kind != Geometric {
		t.Fatalf("plan after small pushes = %q %q %v, want geometric", kind, reason, err)
	}
	if _, err := m.Run(ctx, r, kind, reason); err != nil {
		t.Fatal(err)
	}
	after, _ := Inspect(r.Path)
	if p := after.PreferredPack(); p == nil || p.Name != pref || sha(t, filepath.Join(r.Path, "objects", "pack", pref)) != prefSum {
		t.Fatalf("geometric fold rewrote the preferred pack")
	}
	if len(after.Packs) >= len(mid.Packs) {
		t.Fatalf("geometric fold left %d packs (had %d)", len(after.Packs), len(mid.Packs))
	}
	if !after.Bitmap {
		t.Fatal("no bitmap after the fold")
	}
	env.Fsck(r.Path)
	if d, err := m.ReadDrift(ctx, r.Path); err != nil || d.New == 0 || d.Ratio() > m.Drift {
		t.Fatalf("drift %+v %v", d, err)
	}
	// A force push and branch deletions that drop much of the history leave the preferred
	// pack full of objects no clone wants: full.
	env.Git(w, "push", "-q", "-f", "origin", "main~30:main", ":branch0", ":branch1", ":branch2")
	if kind, reason, err := m.Plan(ctx, r.Path); err != nil || kind != Full {
		t.Fatalf("plan after a large push = %q %q %v, want full", kind, reason, err)
	}
	if _, err := m.Maintain(ctx, r, false); err != nil {
		t.Fatal(err)
	}
	assertShape(t, env, r)
	env.Fsck(r.Path)
}

func sha(t *testing.T, path string) string {
	out, err := exec.Command("sha1sum", path).Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(out))[0]
}

// TestKilledMidwayLeavesServableRepo kills maintenance's git process group
// at random points, several times; the repository must stay fsck-clean and
// clonable, and the next run must bring it into shape.
func TestKilledMidwayLeavesServableRepo(t *testing.T) {
	t.Parallel()
	env, r := newRepo(t)
	m := quietMaintainer()
	want := env.RevParse(r.Path, "main")
	pull := env.RevParse(r.Path, "refs/pull/9/head")
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	for i := 0; i < 6; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(5+rng.IntN(150))*time.Millisecond)
		kind := Full
		if i%3 == 2 {
			kind = Geometric
		}
		m.Run(ctx, r, kind, "test")
		cancel()
		env.Fsck(r.Path)
		w := filepath.Join(t.TempDir(), "w")
		env.Git("", "clone", "-q", "--no-local", r.Path, w)
		if got := env.RevParse(w, "HEAD"); got != want {
			t.Fatalf("clone after kill %d has %s, want %s", i, got, want)
		}
		if got := env.RevParse(r.Path, "refs/pull/9/head^{commit}"); got != pull {
			t.Fatal("lost refs/pull/9/head")
		}
	}
	if _, err := m.Maintain(context.Background(), r, false); err != nil {
		t.Fatal(err)
	}
	if kind, reason, _ := m.Plan(context.Background(), r.Path); kind != None {
		l, _ := Inspect(r.Path)
		t.Fatalf("after recovery: plan %q %q\n%+v", kind, reason, l)
	}
	assertShape(t, env, r)
	env.Fsck(r.Path)
}

func TestGeometricCheck(t *testing.T) {
	for _, c := range []struct {
		sizes []int64
		want  bool
	}{{nil, true}, {[]int64{100}, true}, {[]int64{100, 1}, true}, {[]int64{100, 3, 1}, true}, {[]int64{100, 2, 1}, true}, {[]int64{100, 3, 2}, false}, {[]int64{5, 5}, false}} {
		if got := geometric(c.sizes, 2); got != c.want {
			t.Errorf("geometric(%v) = %v", c.sizes, got)
		}
	}
}

// TestSchedulerBudget: once the runs of the last hour used the CPU budget,
// a pass stops; without a budget it maintains every repository.
func TestSchedulerBudget(t *testing.T) {
	t.Parallel()
	env := gittest.New(t)
	var repos []repo.Repo
	for i := 0; i < 3; i++ {
		bare := filepath.Join(t.TempDir(), fmt.Sprintf("r%d.git", i))
		env.Build(bare, gittest.Shape{Commits: 5, Seed: uint64(i)})
		repos = append(repos, repo.Repo{Name: fmt.Sprintf("r%d", i), Path: bare})
	}
	list := func() ([]repo.Repo, error) { return repos, nil }
	s := &Scheduler{M: quietMaintainer(), Repos: list, Budget: time.Nanosecond}
	if n := s.Pass(context.Background()); n != 1 {
		t.Fatalf("pass with a used-up budget made %d runs, want 1", n)
	}
	if n := s.Pass(context.Background()); n != 0 {
		t.Fatalf("second pass within the hour made %d runs, want 0", n)
	}
	s = &Scheduler{M: quietMaintainer(), Repos: list, Concurrency: 2}
	if n := s.Pass(context.Background()); n != 2 {
		t.Fatalf("pass without a budget made %d runs, want the 2 left", n)
	}
	if n := s.Pass(context.Background()); n != 0 {
		t.Fatalf("pass over repositories in shape made %d runs", n)
	}
}

// deltaBases reads a pack's index with git verify-pack: for each object,
// its delta base ("" when stored whole).
func deltaBases(t *testing.T, env *gittest.Env, packPath string) map[string]string {
	t.Helper()
	out := env.Git("", "verify-pack", "-v", strings.TrimSuffix(packPath, ".pack")+".idx")
	bases := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 5 && len(f[0]) == 40:
			bases[f[0]] = ""
		case len(f) == 7 && len(f[0]) == 40:
			bases[f[0]] = f[6]
		}
	}
	return bases
}

// TestCheckoutStoredWhole: the preferred pack stores the objects of HEAD's
// tree whole (or as deltas against each other), even where git alone would
// make the newest version of a file a delta against an older, larger one,
// so a shallow clone or a partial clone's checkout gets them as a copy.
func TestCheckoutStoredWhole(t *testing.T) {
	t.Parallel()
	env := gittest.New(t)
	work := filepath.Join(t.TempDir(), "w")
	env.Git("", "init", "-q", "-b", "main", work)
	var lines []string
	for i := range 400 {
		lines = append(lines, fmt.Sprintf("line %d of a file that will shrink, with some words to compress", i))
	}
	write := func(n int, extra string) {
		body := strings.Join(lines[:n], "\n") + "\n" + extra
		os.WriteFile(filepath.Join(work, "shrinks.txt"), []byte(body), 0o644)
		os.WriteFile(filepath.Join(work, "other.txt"), []byte(fmt.Sprintf("other %d\n", n)), 0o644)
		env.Git(work, "add", "-A")
		env.Git(work, "commit", "-q", "-m", fmt.Sprintf("%d lines", n))
	}
	write(400, "")
	write(380, "changed\n")
	write(300, "changed again\n") // the tip is the smallest version
	bare := filepath.Join(t.TempDir(), "app.git")
	env.Git("", "clone", "-q", "--bare", work, bare)
	tip := strings.TrimSpace(env.Git(bare, "rev-parse", "HEAD:shrinks.txt"))
	inTip := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(env.Git(bare, "ls-tree", "-r", "-t", "HEAD")), "\n") {
		inTip[strings.Fields(line)[2]] = true
	}

	// Without the island git makes the tip a delta against an older version.
	plain := filepath.Join(t.TempDir(), "plain")
	cmd := exec.Command("git", "pack-objects", "--revs", "--delta-base-offset", "-q", plain)
	cmd.Dir, cmd.Env, cmd.Stdin = bare, append(env.Vars, "GIT_DIR="+bare), strings.NewReader("main\n")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	if base := deltaBases(t, env, plain+"-"+strings.TrimSpace(string(out))+".pack")[tip]; base == "" || inTip[base] {
		t.Fatalf("the test's history does not make git store the tip as a delta of an older version (base %q)", base)
	}

	// Packed as git gc would, the checkout holds that delta too, which
	// ReadCheckout (repo show) reports.
	env.Git(bare, "repack", "-a", "-d", "-q")
	c, err := quietMaintainer().ReadCheckout(context.Background(), bare)
	if err != nil || c.Objects != int64(len(inTip))+1 || c.Outside < 1 || c.Deltas < c.Outside {
		t.Fatalf("before maintenance: %+v (%v), want %d objects and the tip's delta outside the tree", c, err, len(inTip)+1)
	}

	r := repo.Repo{Name: "app", Path: bare}
	if _, err := quietMaintainer().Maintain(context.Background(), r, true); err != nil {
		t.Fatal(err)
	}
	if c, err := quietMaintainer().ReadCheckout(context.Background(), bare); err != nil || c.Objects != int64(len(inTip))+1 || c.Outside != 0 {
		t.Fatalf("after maintenance: %+v (%v), want %d objects and no delta outside the tree", c, err, len(inTip)+1)
	}
	l := assertShape(t, env, r)
	bases := deltaBases(t, env, filepath.Join(bare, "objects", "pack", l.PreferredPack().Name))
	for oid := range inTip {
		if base, ok := bases[oid]; !ok || base != "" && !inTip[base] {
			t.Errorf("object %s of HEAD's tree: in the preferred pack %v, delta base %q outside the tree", oid, ok, base)
		}
	}
	if bases[tip] != "" {
		t.Errorf("the tip's version is still a delta (against %s)", bases[tip])
	}
	if refs := env.Git(bare, "for-each-ref", "refs/packwire/"); refs != "" {
		t.Fatalf("maintenance changed the served repository's refs: %s", refs)
	}
	if _, err := os.Stat(filepath.Join(bare, islandDir)); err == nil {
		t.Fatal("maintenance left its island repository")
	}
	env.Fsck(bare)
}

func TestReadCheckoutUnbornHEAD(t *testing.T) {
	env := gittest.New(t)
	bare := filepath.Join(t.TempDir(), "empty.git")
	env.Git("", "init", "-q", "--bare", bare)
	if c, err := quietMaintainer().ReadCheckout(context.Background(), bare); err != nil || c != (Checkout{}) {
		t.Fatalf("an unborn HEAD: %+v, %v; want nothing", c, err)
	}
}

// TestNewHistoryRebuilds: new history alone, at about a fifth of what a
// clone fetches, makes the preferred pack rebuilt (NewWeight 1; at the
// former 0.25 it took 40%).
func TestNewHistoryRebuilds(t *testing.T) {
	t.Parallel()
	env, r := newRepo(t)
	m := quietMaintainer()
	ctx := context.Background()
	if _, err := m.Maintain(ctx, r, true); err != nil {
		t.Fatal(err)
	}
	d, err := m.ReadDrift(ctx, r.Path)
	if err != nil {
		t.Fatal(err)
	}
	w := filepath.Join(t.TempDir(), "w")
	env.Git("", "clone", "-q", "--no-local", r.Path, w)
	// A commit at the top level adds three objects: commit, tree, blob.
	for i := range int(d.Closure/5/3) + 1 {
		os.WriteFile(filepath.Join(w, "grows.txt"), []byte(fmt.Sprintf("version %d\n", i)), 0o644)
		env.Git(w, "add", "grows.txt")
		env.Git(w, "commit", "-qm", "grow")
	}
	env.Git(w, "push", "-q", "--receive-pack=git -c receive.unpackLimit=1 receive-pack", "origin", "main")
	d, err = m.ReadDrift(ctx, r.Path)
	if share := float64(d.New) / float64(d.Closure); err != nil || share < 0.12 || share > 0.35 || d.Stale != 0 {
		t.Fatalf("after the push: %+v %v; the test wants 12-35%% new, nothing stale", d, err)
	}
	kind, reason, err := m.Plan(ctx, r.Path)
	if err != nil || kind != Full || !strings.HasPrefix(reason, "drift ") {
		t.Fatalf("plan after %d new of %d objects = %q %q %v, want a full run for drift", d.New, d.Closure, kind, reason, err)
	}
}
