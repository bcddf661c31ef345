package sizer

import (
	"bufio"
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"packwire/internal/gittest"
	"packwire/internal/lab/synth"
	"packwire/internal/oid"
)

// knownRepo builds a repository whose every figure can be worked out by
// hand (see the expectations in TestKnownRepository).
func knownRepo(t *testing.T, env *gittest.Env) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "known.git")
	env.Git("", "init", "--bare", "-q", dir)
	blob := func(n int) string { return strings.Repeat("x", n-1) + "\n" }
	var s strings.Builder
	commit := func(ref string, mark int, msg string, parents ...int) {
		s.WriteString("commit " + ref + "\nmark :" + strconv.Itoa(mark) + "\n")
		s.WriteString("committer T <t@example.com> " + strconv.Itoa(1700000000+mark) + " +0000\n")
		s.WriteString("data " + strconv.Itoa(len(msg)) + "\n" + msg)
		for i, p := range parents {
			if i == 0 {
				s.WriteString("from :" + strconv.Itoa(p) + "\n")
			} else {
				s.WriteString("merge :" + strconv.Itoa(p) + "\n")
			}
		}
	}
	file := func(mode, path, content string) {
		s.WriteString("M " + mode + " inline " + path + "\ndata " + strconv.Itoa(len(content)) + "\n" + content + "\n")
	}
	commit("refs/heads/main", 1, "root\n")
	file("100644", "README", blob(10))
	file("100644", "src/a.c", blob(100))
	file("100644", "src/deep/x/y/z.txt", blob(5))
	file("120000", "link", "README")
	s.WriteString("M 160000 1111111111111111111111111111111111111111 sub\n\n")
	commit("refs/heads/main", 2, "second\n", 1)
	file("100644", "src/a.c", blob(200))
	s.WriteString("\n")
	commit("refs/heads/topic", 3, "topic\n", 1)
	file("100644", "big.bin", blob(1000))
	s.WriteString("\n")
	commit("refs/heads/main", 4, "merge topic\n", 2, 3)
	file("100644", "big.bin", blob(1000))
	s.WriteString("\ntag v1\nfrom :2\ntagger T <t@example.com> 1700000010 +0000\ndata 3\nv1\n\n")
	cmd := exec.Command("git", "fast-import", "--quiet")
	cmd.Dir, cmd.Env, cmd.Stdin = dir, env.Vars, strings.NewReader(s.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("fast-import: %v\n%s", err, out)
	}
	env.Git(dir, "symbolic-ref", "HEAD", "refs/heads/main")
	env.Git(dir, "tag", "-a", "-m", "a tag of a tag", "v1-nested", "v1") // tag depth 2
	return dir
}

func TestKnownRepository(t *testing.T) {
	env := gittest.New(t)
	dir := knownRepo(t, env)
	r, err := Measure(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	// Sizes of commits and trees, object by object, from git itself.
	var commitSize, treeSize, maxCommit int64
	for _, line := range strings.Split(strings.TrimSpace(env.Git(dir, "rev-list", "--all", "--objects")), "\n") {
		oid, _, _ := strings.Cut(line, " ")
		typ := strings.TrimSpace(env.Git(dir, "cat-file", "-t", oid))
		size, _ := strconv.ParseInt(strings.TrimSpace(env.Git(dir, "cat-file", "-s", oid)), 10, 64)
		switch typ {
		case "commit":
			commitSize += size
			maxCommit = max(maxCommit, size)
		case "tree":
			treeSize += size
		}
	}
	head := env.RevParse(dir, "HEAD^{tree}")
	o, b, h, c := r.Overall, r.Biggest, r.History, r.Checkout
	for _, f := range []struct {
		name      string
		got, want int64
	}{
		// 4 commits: root, second, topic, merge.
		{"commits", o.CommitCount.Value, 4}, {"commit size", o.CommitSize.Value, commitSize},
		// Trees: root, src, deep, x, y; second's root and src; topic's root; the merge's root.
		{"trees", o.TreeCount.Value, 9}, {"tree size", o.TreeSize.Value, treeSize},
		// Entries: 4+2+1+1+1, 4+2, 5, 5.
		{"tree entries", o.TreeEntries.Value, 25},
		// README 10, a.c 100 and 200, z.txt 5, the link "README" 6, big.bin 1000 (once).
		{"blobs", o.BlobCount.Value, 6}, {"blob size", o.BlobSize.Value, 1321},
		{"annotated tags", o.TagCount.Value, 2}, {"refs", o.RefCount.Value, 4},
		{"branches", int64(o.Branches), 2}, {"tags", int64(o.Tags), 2},
		{"max commit size", b.CommitSize.Value, maxCommit}, {"max parents", b.Parents.Value, 2},
		{"max tree entries", b.TreeEntries.Value, 5}, {"max blob size", b.BlobSize.Value, 1000},
		{"history depth", h.Depth.Value, 3}, {"tag depth", h.TagDepth.Value, 2},
		// main: root, src, deep, x, y; README, a.c, z.txt, big.bin; 10+200+5+1000 bytes.
		{"directories", c.Directories.Value, 5}, {"path depth", c.PathDepth.Value, 5},
		{"path length", c.PathLength.Value, int64(len("src/deep/x/y/z.txt"))},
		{"files", c.Files.Value, 4}, {"file size", c.FileSize.Value, 1215},
		{"symlinks", c.Symlinks.Value, 1}, {"submodules", c.Submodules.Value, 1},
	} {
		if f.got != f.want {
			t.Errorf("%s: %d, want %d", f.name, f.got, f.want)
		}
	}
	if o.DiskSize <= 0 {
		t.Errorf("disk size %d", o.DiskSize)
	}
	if b.BlobSize.Name != "HEAD:big.bin" || b.Parents.Object != env.RevParse(dir, "main") {
		t.Errorf("biggest blob named %q, most parents in %s", b.BlobSize.Name, b.Parents.Object)
	}
	if h.TagDepth.Name != "refs/tags/v1-nested" || c.FileSize.Object != head || c.FileSize.Name != "HEAD^{tree}" {
		t.Errorf("deepest tag %q, biggest checkout %s %q", h.TagDepth.Name, c.FileSize.Object, c.FileSize.Name)
	}
	if h.TagDepth.Concern != 2 || b.Parents.Concern != 0.2 {
		t.Errorf("concern of tag depth 2: %g, of 2 parents: %g", h.TagDepth.Concern, b.Parents.Concern)
	}

	var table bytes.Buffer
	r.WriteTable(&table, 0)
	for _, want := range []string{
		"| * Maximum tag depth [", "|     2     | **                             |",
		"|   * Count                    |     9     |                                |",
		"|   * Maximum size [", "|  1000 B   |",
		"HEAD:big.bin", "refs/tags/v1-nested",
	} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	table.Reset()
	r.WriteTable(&table, 1) // only figures of concern: the tag depth
	if got := table.String(); !strings.Contains(got, "Maximum tag depth") || strings.Contains(got, "Number of files") {
		t.Errorf("--threshold 1 table:\n%s", got)
	}
}

// TestSynthRepository checks sizer's counts against synth's on a
// generated repository.
func TestSynthRepository(t *testing.T) {
	env := gittest.New(t)
	t.Setenv("HOME", env.Home)
	dir := filepath.Join(t.TempDir(), "jq.git")
	res, err := synth.Generate(context.Background(), synth.Options{Shape: "jquery", Scale: 0.03, Out: dir, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	r, err := Measure(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	o := r.Overall
	if o.CommitCount.Value != int64(res.Commits) || o.TreeCount.Value != int64(res.Trees) || o.BlobCount.Value != int64(res.Blobs) ||
		o.Branches != res.Branches || o.Tags != res.Tags || o.TagCount.Value != int64(res.Tags) || o.RefCount.Value != int64(res.Branches+res.Tags) {
		t.Fatalf("sizer %+v\nsynth %+v", o, res)
	}
	if r.Biggest.Parents.Value != 2 || r.History.Depth.Value < 10 || r.History.Depth.Value >= int64(res.Commits) {
		t.Fatalf("parents %d, history depth %d of %d commits", r.Biggest.Parents.Value, r.History.Depth.Value, res.Commits)
	}
	if files := strings.Count(env.Git(dir, "ls-tree", "-r", "--name-only", "HEAD"), "\n"); r.Checkout.Files.Value < int64(files) {
		t.Fatalf("biggest checkout has %d files, HEAD alone %d", r.Checkout.Files.Value, files)
	}
}

func TestNotARepository(t *testing.T) {
	gittest.New(t)
	dir := t.TempDir()
	if _, err := Measure(context.Background(), dir); err == nil || !strings.Contains(err.Error(), "is not a git repository") {
		t.Fatalf("error %v", err)
	}
}

func TestHuman(t *testing.T) {
	for _, tc := range []struct {
		n      int64
		binary bool
		want   string
	}{
		{0, false, "0    "}, {999, false, "999    "}, {7873, false, "7.87 k  "}, {22579, false, "22.6 k  "},
		{2174798, false, "2.17 M  "}, {1000, true, "1000 B  "}, {1024, true, "1.00 KiB"}, {42 << 20, true, "42.0 MiB"},
	} {
		if got := human(tc.n, tc.binary); got != tc.want {
			t.Errorf("human(%d, %v) = %q, want %q", tc.n, tc.binary, got, tc.want)
		}
	}
}

func FuzzTreeEntries(f *testing.F) {
	f.Add([]byte("100644 a\x00"+strings.Repeat("\x01", 20)+"40000 dir\x00"+strings.Repeat("\x02", 20)), 20)
	f.Add([]byte("100644 a\x00abc"), 20)
	f.Add([]byte(""), 32)
	f.Fuzz(func(t *testing.T, tree []byte, hashLen int) {
		if hashLen != 20 && hashLen != 32 {
			return
		}
		n, err := countTreeEntries(tree, hashLen)
		if err == nil && len(tree) < n*(hashLen+4) {
			t.Fatalf("%d entries in %d bytes", n, len(tree))
		}
	})
}

func FuzzLsTree(f *testing.F) {
	f.Add([]byte("100644 blob " + strings.Repeat("a", 40) + "     123\tsrc/a.c"))
	f.Add([]byte("040000 tree " + strings.Repeat("b", 40) + "       -\tsrc"))
	f.Add([]byte("160000 commit " + strings.Repeat("c", 64) + "       -\tsub\tmodule"))
	f.Fuzz(func(t *testing.T, rec []byte) {
		e, err := parseLsTree(rec)
		if err == nil && (e.path == "" || e.size < 0 || !oid.Valid(e.oid)) {
			t.Fatalf("accepted %q as %+v", rec, e)
		}
	})
}

func FuzzCatFile(f *testing.F) {
	oid := strings.Repeat("a", 40)
	f.Add([]byte(oid + " tag 52\nobject " + oid + "\ntype commit\n\n"))
	f.Add([]byte(oid + " tree 0\n\n" + oid + " blob 3\nabc\n"))
	f.Add([]byte(oid + " blob 99999999999\nabc"))
	f.Add([]byte(oid + " missing\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		readBatch(bufio.NewReader(bytes.NewReader(data)), func(oid, typ string, body []byte) error {
			parseTagHeader(body)
			return nil
		})
		for _, line := range strings.Split(string(data), "\n") {
			if _, _, size, disk, err := parseCheckLine(line); err == nil && (size < 0 || disk < 0) {
				t.Fatalf("negative sizes from %q", line)
			}
		}
	})
}
