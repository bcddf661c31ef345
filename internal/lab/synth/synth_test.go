package synth

import (
	"bytes"
	"compress/gzip"
	"context"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"packwire/internal/gittest"
)

// isolate gives Generate's git an isolated HOME and no system config, as
// gittest does for the client.
func isolate(t *testing.T) *gittest.Env {
	env := gittest.New(t)
	t.Setenv("HOME", env.Home)
	t.Setenv("GIT_CONFIG_NOSYSTEM", "1")
	return env
}

func generateT(t *testing.T, shape string, scale float64, seed int64) (Result, stats, string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), shape+".git")
	res, st, err := generate(context.Background(), Options{Shape: shape, Scale: scale, Out: out, Seed: seed})
	if err != nil {
		t.Fatalf("generate %s x%g: %v", shape, scale, err)
	}
	return res, st, out
}

func TestSameSeedSameObjects(t *testing.T) {
	env := isolate(t)
	a, _, dirA := generateT(t, "jquery", 0.02, 7)
	b, _, dirB := generateT(t, "jquery", 0.02, 7)
	c, _, dirC := generateT(t, "jquery", 0.02, 8)
	refsA := env.Git(dirA, "for-each-ref", "--format=%(objectname) %(refname)")
	objects := func(dir string) string {
		return env.Git(dir, "cat-file", "--batch-all-objects", "--batch-check=%(objectname) %(objecttype) %(objectsize)")
	}
	if a.Head != b.Head || refsA != env.Git(dirB, "for-each-ref", "--format=%(objectname) %(refname)") || objects(dirA) != objects(dirB) {
		t.Fatalf("the same seed gave different repositories: %s vs %s", a.Head, b.Head)
	}
	if c.Head == a.Head || objects(dirC) == objects(dirA) {
		t.Fatal("another seed gave the same repository")
	}
	// Written in many small chunks (blobs grouped differently in the
	// pack), the objects are the same.
	defer func(n int) { chunkBlobs = n }(chunkBlobs)
	chunkBlobs = 37
	d, _, dirD := generateT(t, "jquery", 0.02, 7)
	if d.Head != a.Head || objects(dirD) != objects(dirA) {
		t.Fatal("writing in small chunks changed the repository")
	}
	if strings.Count(refsA, "\n") < 3 {
		t.Fatalf("too few refs:\n%s", refsA)
	}
}

// TestCountsFollowTheStudy checks each shape at a small scale against the
// study's counts times the scale, and the generator's own model of the
// objects (counts, main's tree id) against what git stored.
func TestCountsFollowTheStudy(t *testing.T) {
	env := isolate(t)
	for _, tc := range []struct {
		shape string
		scale float64
	}{{"jquery", 0.05}, {"swift", 0.002}, {"linux", 0.002}} {
		t.Run(tc.shape, func(t *testing.T) {
			res, st, dir := generateT(t, tc.shape, tc.scale, 1)
			sh := shapes[tc.shape]
			want := func(n int) float64 { return tc.scale * float64(n) }
			if res.Commits != int(math.Round(want(sh.commits))) {
				t.Errorf("commits %d, want %.0f", res.Commits, want(sh.commits))
			}
			if d := math.Abs(float64(res.Blobs)/want(sh.blobs) - 1); d > 0.03 {
				t.Errorf("blobs %d, want %.0f within 3%%", res.Blobs, want(sh.blobs))
			}
			if d := math.Abs(float64(res.Trees)/want(sh.trees) - 1); d > 0.08 {
				t.Errorf("trees %d, want %.0f within 8%%", res.Trees, want(sh.trees))
			}
			if st.commits != res.Commits || st.trees != res.Trees || st.blobs != res.Blobs {
				t.Errorf("the generator counted %d commits, %d trees, %d blobs; git has %d, %d, %d",
					st.commits, st.trees, st.blobs, res.Commits, res.Trees, res.Blobs)
			}
			if tree := env.RevParse(dir, "main^{tree}"); tree != st.mainTree {
				t.Errorf("main's tree is %s, the generator computed %s", tree, st.mainTree)
			}
			if res.Head != env.RevParse(dir, "HEAD") {
				t.Errorf("HEAD is not main")
			}
			if res.Bytes <= 0 {
				t.Errorf("size on disk %d", res.Bytes)
			}
			env.Fsck(dir)
			t.Logf("%s x%g: %+v", tc.shape, tc.scale, res)
		})
	}
}

// TestHistoryHasTheShape looks at what a jquery-shaped history is made of.
func TestHistoryHasTheShape(t *testing.T) {
	env := isolate(t)
	res, _, dir := generateT(t, "jquery", 0.05, 1)
	if res.Branches < 2 || res.Tags < 2 {
		t.Fatalf("branches %d, tags %d", res.Branches, res.Tags)
	}
	if head := strings.TrimSpace(env.Git(dir, "symbolic-ref", "HEAD")); head != "refs/heads/main" {
		t.Fatalf("HEAD -> %s", head)
	}
	merges := strings.Fields(env.Git(dir, "rev-list", "--merges", "main"))
	if len(merges) < 3 {
		t.Fatalf("%d merges on main", len(merges))
	}
	if env.Git(dir, "for-each-ref", "--format=%(objecttype)", "refs/tags/1.0.0") != "tag\n" {
		t.Fatal("tag 1.0.0 is not an annotated tag")
	}
	if out := env.Git(dir, "for-each-ref", "refs/heads/1.x-stable"); out == "" {
		t.Fatal("no release branch 1.x-stable")
	}
	// A release branch forked from main and has commits of its own.
	if n, _ := strconv.Atoi(strings.TrimSpace(env.Git(dir, "rev-list", "--count", "main..1.x-stable"))); n == 0 {
		t.Fatal("the release branch has no backports")
	}

	// Most commits touch one to five files.
	log := env.Git(dir, "log", "--no-merges", "--format=format:@", "--name-only", "main")
	var sizes []int
	for _, c := range strings.Split(log, "@")[1:] {
		sizes = append(sizes, len(strings.Fields(c)))
	}
	small := 0
	for _, n := range sizes[:len(sizes)-1] { // the root commit adds the first files
		if n >= 1 && n <= 5 {
			small++
		}
	}
	t.Logf("%d of %d commits touch 1-5 files", small, len(sizes)-1)
	if float64(small) < 0.85*float64(len(sizes)-1) {
		t.Fatalf("only %d of %d commits touch 1-5 files", small, len(sizes)-1)
	}

	// A shallow src/ and test/ tree of text files that compress like code.
	files := strings.Fields(env.Git(dir, "ls-tree", "-r", "--name-only", "main"))
	var src, test, deepest int
	for _, f := range files {
		deepest = max(deepest, strings.Count(f, "/"))
		src += b2i(strings.HasPrefix(f, "src/"))
		test += b2i(strings.HasPrefix(f, "test/"))
	}
	if src == 0 || test == 0 || deepest > 5 {
		t.Fatalf("%d files under src/, %d under test/, deepest at %d levels", src, test, deepest)
	}
	var text bytes.Buffer
	for _, f := range files {
		text.WriteString(env.Git(dir, "cat-file", "-p", "main:"+f))
	}
	for _, c := range text.Bytes() {
		if c != '\n' && c != '\t' && (c < ' ' || c > '~') {
			t.Fatalf("byte %#x in the checkout: not plain text", c)
		}
	}
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write(text.Bytes())
	zw.Close()
	ratio := float64(text.Len()) / float64(z.Len())
	t.Logf("the checkout (%d bytes) compresses %.1fx", text.Len(), ratio)
	if ratio < 2.5 || ratio > 12 {
		t.Fatalf("the checkout compresses %.1fx; source code does 3-6x", ratio)
	}

	// Versions of a file differ by a few lines: fast-import's pack (blobs
	// grouped by path) and a full repack store most blobs as deltas.
	for _, when := range []string{"as written", "after a repack"} {
		if when != "as written" {
			env.Git(dir, "repack", "-adfq")
		}
		blobs, deltas := blobDeltas(t, env, dir)
		t.Logf("%d of %d blobs are deltas %s", deltas, blobs, when)
		if blobs == 0 || float64(deltas) < 0.6*float64(blobs) {
			t.Fatalf("%d of %d blobs stored as deltas %s", deltas, blobs, when)
		}
	}
}

func blobDeltas(t *testing.T, env *gittest.Env, dir string) (blobs, deltas int) {
	verify := env.Git(dir, "verify-pack", "-v", globPacks(t, dir)[0])
	for _, line := range strings.Split(verify, "\n") {
		f := strings.Fields(line)
		if len(f) >= 5 && f[1] == "blob" {
			blobs++
			if len(f) >= 7 {
				deltas++
			}
		}
	}
	return blobs, deltas
}

func globPacks(t *testing.T, dir string) []string {
	packs, _ := filepath.Glob(filepath.Join(dir, "objects", "pack", "*.idx"))
	if len(packs) != 1 {
		t.Fatalf("%d packs", len(packs))
	}
	return packs
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestBadOptions(t *testing.T) {
	isolate(t)
	full := t.TempDir()
	os.WriteFile(filepath.Join(full, "x"), []byte("x"), 0o644)
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Shape: "gitlab", Scale: 1, Out: t.TempDir()}, `unknown shape "gitlab"`},
		{Options{Shape: "jquery", Scale: 0, Out: t.TempDir()}, "out of range"},
		{Options{Shape: "jquery", Scale: -1, Out: t.TempDir()}, "out of range"},
		{Options{Shape: "jquery", Scale: math.NaN(), Out: t.TempDir()}, "out of range"},
		{Options{Shape: "jquery", Scale: 100, Out: t.TempDir()}, "out of range"},
		{Options{Shape: "jquery", Scale: 0.001, Out: t.TempDir()}, "too small"},
		{Options{Shape: "jquery", Scale: 0.01}, "no output directory"},
		{Options{Shape: "jquery", Scale: 0.02, PullRefs: -1, Out: t.TempDir()}, "pull refs -1 is out of range"},
		{Options{Shape: "jquery", Scale: 0.02, PullRefs: MaxPullRefs + 1, Out: t.TempDir()}, "out of range"},
		{Options{Shape: "jquery", Scale: 0.01, Out: full}, "not empty"},
	} {
		_, err := Generate(context.Background(), tc.o)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want %q", tc.o, err, tc.want)
		}
	}
	if entries, _ := os.ReadDir(full); len(entries) != 1 {
		t.Fatal("a refused run touched a non-empty output directory")
	}
}

func TestCancelRemovesOutput(t *testing.T) {
	isolate(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out := filepath.Join(t.TempDir(), "r.git")
	if _, err := Generate(ctx, Options{Shape: "jquery", Scale: 0.05, Out: out}); err == nil {
		t.Fatal("a cancelled run succeeded")
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("a cancelled run left %s behind: %v", out, err)
	}
	// An empty directory given by the caller stays, emptied.
	empty := t.TempDir()
	if _, err := Generate(ctx, Options{Shape: "jquery", Scale: 0.05, Out: empty}); err == nil {
		t.Fatal("a cancelled run succeeded")
	}
	if entries, err := os.ReadDir(empty); err != nil || len(entries) != 0 {
		t.Fatalf("after a cancelled run the output directory holds %v (%v)", entries, err)
	}
}

func TestShapes(t *testing.T) {
	got := Shapes()
	if len(got) != len(shapes) {
		t.Fatalf("Shapes() = %v", got)
	}
	for _, s := range got {
		if shapes[s] == nil {
			t.Fatalf("Shapes() names %q, which is not a shape", s)
		}
	}
}
