package reach

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"packwire/internal/packidx"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"packwire/internal/gittest"
)

// gitWith runs git in dir with input on its stdin.
func gitWith(t *testing.T, env *gittest.Env, dir, input string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir, cmd.Env, cmd.Stdin = dir, env.Vars, strings.NewReader(input)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %v: %v", args, err)
	}
	return strings.TrimSpace(string(out))
}

// blobWithFirstByte is the content of a blob whose id starts with b.
func blobWithFirstByte(b byte) string {
	for i := 0; ; i++ {
		content := fmt.Sprintf("blob %d for bucket %02x\n", i, b)
		if sha1.Sum([]byte(fmt.Sprintf("blob %d\x00%s", len(content), content)))[0] == b {
			return content
		}
	}
}

// TestPackIndexLookup: every object of a pack git wrote is found in its
// .idx, objects in the first and the last fanout bucket included; ids
// the pack lacks (in those buckets, and next to a present one) are not;
// and a short or corrupt .idx is refused, also one whose checksum was
// made right again over names out of order or a decreasing fanout.
func TestPackIndexLookup(t *testing.T) {
	env := gittest.New(t)
	repo := filepath.Join(t.TempDir(), "r.git")
	env.Build(repo, gittest.Shape{Commits: 4, Branches: 1, Seed: 3})
	var ids []string
	for _, b := range []byte{0x00, 0xff} {
		ids = append(ids, gitWith(t, env, repo, blobWithFirstByte(b), "hash-object", "-w", "--stdin"))
	}
	all := strings.Fields(gitWith(t, env, repo, "", "rev-list", "--objects", "--no-object-names", "--all"))
	all = append(all, ids...)
	dir := t.TempDir()
	name := gitWith(t, env, repo, strings.Join(all, "\n")+"\n", "pack-objects", "-q", filepath.Join(dir, "p"))
	raw, err := os.ReadFile(filepath.Join(dir, "p-"+name+".idx"))
	if err != nil {
		t.Fatal(err)
	}
	idx, err := packidx.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if got := idx.Len(); got != len(all) {
		t.Fatalf("%d objects in the index, %d packed", got, len(all))
	}
	// Has (loaded) and Lookup (read on demand) agree, both ways.
	onDisk := bytes.NewReader(raw)
	for _, id := range all {
		if !idx.Has(id) || !packidx.Lookup(onDisk, int64(len(raw)), id) {
			t.Errorf("%s not found", id)
		}
	}
	first, last := ids[0], ids[1]
	for _, absent := range []string{
		strings.Repeat("0", 40), strings.Repeat("f", 40), // the first and last buckets' ends
		first[:39] + string("0123456789abcdef"[(strings.IndexByte("0123456789abcdef", first[39])+1)%16]), // next to a present one
		last[:38] + "00", "short", strings.Repeat("g", 40), strings.Repeat("a", 64),
	} {
		if (idx.Has(absent) || packidx.Lookup(onDisk, int64(len(raw)), absent)) && !slices.Contains(all, absent) {
			t.Errorf("%s found, not in the pack", absent)
		}
	}

	// Refused: short, corrupt, and consistent checksums over bad tables.
	resum := func(b []byte) []byte {
		sum := sha1.Sum(b[:len(b)-20])
		copy(b[len(b)-20:], sum[:])
		return b
	}
	outOfOrder := slices.Clone(raw) // the first two names swapped
	a, b := slices.Clone(outOfOrder[packidxHeader:packidxHeader+20]), slices.Clone(outOfOrder[packidxHeader+20:packidxHeader+40])
	copy(outOfOrder[packidxHeader:], b)
	copy(outOfOrder[packidxHeader+20:], a)
	decreasing := slices.Clone(raw)
	binary.BigEndian.PutUint32(decreasing[8+4*0x10:], binary.BigEndian.Uint32(decreasing[8+4*0x0f:])+1)
	binary.BigEndian.PutUint32(decreasing[8+4*0x11:], 0)
	flipped := slices.Clone(raw)
	flipped[packidxHeader+5] ^= 1
	for what, bad := range map[string][]byte{
		"empty":               nil,
		"header only":         raw[:packidxHeader],
		"truncated":           raw[:len(raw)-1],
		"a name changed":      flipped,
		"names out of order":  resum(outOfOrder),
		"a decreasing fanout": resum(decreasing),
		"version 3":           resum(append(append([]byte{}, raw[:4]...), append([]byte{0, 0, 0, 3}, raw[8:]...)...)),
		"objects missing":     resum(append(slices.Clone(raw[:packidxHeader+20]), raw[len(raw)-40:]...)),
	} {
		if _, err := packidx.Parse(bad); !errors.Is(err, packidx.ErrBad) {
			t.Errorf("%s: %v, want refused", what, err)
		}
	}
}

// packidxHeader is where a version 2 .idx's names begin.
const packidxHeader = 8 + 256*4

// writeCloneBundle writes a clone bundle into repo as maintenance does: a
// pack of the closure of refs (name -> id), kept in objects/pack, under a
// v2 header naming them, written by rename.
func writeCloneBundle(t *testing.T, env *gittest.Env, repo string, refs map[string]string) {
	t.Helper()
	var tips, header strings.Builder
	header.WriteString("# v2 git bundle\n")
	for _, name := range slices.Sorted(maps.Keys(refs)) {
		tips.WriteString(refs[name] + "\n")
		header.WriteString(refs[name] + " " + name + "\n")
	}
	header.WriteString("\n")
	name := gitWith(t, env, repo, tips.String(), "pack-objects", "--revs", "-q", filepath.Join(repo, "objects", "pack", "pack"))
	pack, err := os.ReadFile(filepath.Join(repo, "objects", "pack", "pack-"+name+".pack"))
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(repo, "bundle.tmp")
	if err := os.WriteFile(tmp, append([]byte(header.String()), pack...), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(repo, "clone.bundle")); err != nil {
		t.Fatal(err)
	}
}

// TestHavesInTheServedBundle: with a served clone bundle, haves the bundle
// holds (its tips, older commits, a tree, a blob, and a deleted branch's
// commit: the bundle still gives them to every reader) pass without git
// and are not dropped; a have outside the bundle still goes to git (a
// commit pushed since, kept; a secret no ref reaches, dropped). Without
// Bundle, or after the bundle is rewritten without the deleted branch,
// or with its pack's .idx gone, those haves go to git again.
func TestHavesInTheServedBundle(t *testing.T) {
	env := gittest.New(t)
	repo := filepath.Join(t.TempDir(), "r.git")
	env.Build(repo, gittest.Shape{Commits: 5, Branches: 1, Seed: 1})
	ctx := context.Background()
	tip, old, branch := env.RevParse(repo, "main"), env.RevParse(repo, "main~3"), env.RevParse(repo, "branch0")
	tree, blob := env.RevParse(repo, "main~2^{tree}"), env.RevParse(repo, "main~1:dir0")
	writeCloneBundle(t, env, repo, map[string]string{"refs/heads/main": tip, "refs/heads/branch0": branch, "HEAD": tip})
	// Since: two commits pushed, branch0 deleted, a secret no ref reaches.
	pushed1 := gitWith(t, env, repo, "", "commit-tree", tip+"^{tree}", "-p", tip, "-m", "pushed 1")
	pushed2 := gitWith(t, env, repo, "", "commit-tree", tip+"^{tree}", "-p", pushed1, "-m", "pushed 2")
	env.Git(repo, "update-ref", "refs/heads/main", pushed2)
	env.Git(repo, "update-ref", "-d", "refs/heads/branch0")
	secretBlob := gitWith(t, env, repo, "the password is hunter2\n", "hash-object", "-w", "--stdin")
	secretTree := gitWith(t, env, repo, "100644 blob "+secretBlob+"\tsecret.txt\n", "mktree")
	secret := gitWith(t, env, repo, "", "commit-tree", secretTree, "-p", tip, "-m", "oops")

	check := func(c *Checker, haves []string, wantDrop []string, wantGit bool) {
		t.Helper()
		before := c.GitRuns()
		drop, _, err := c.UnreachableHaves(ctx, repo, haves)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(drop, wantDrop) {
			t.Errorf("haves %v: dropped %v, want %v", haves, drop, wantDrop)
		}
		if ran := c.GitRuns() > before; ran != wantGit {
			t.Errorf("haves %v: git ran %v, want %v", haves, ran, wantGit)
		}
	}
	served := &Checker{Bundle: "clone.bundle"}
	inBundle := []string{tip, old, tree, blob, branch}
	check(served, inBundle, nil, false)
	check(served, inBundle, nil, false) // again, from what was kept
	check(served, append(slices.Clone(inBundle), pushed1), nil, true)
	check(served, []string{old, secret}, []string{secret}, true)
	check(&Checker{}, []string{old}, nil, true)
	check(&Checker{}, []string{branch}, []string{branch}, true)

	// Rewritten without branch0: its commit is no longer given away.
	writeCloneBundle(t, env, repo, map[string]string{"refs/heads/main": pushed2, "HEAD": pushed2})
	check(served, []string{old, pushed1}, nil, false)
	check(served, []string{branch}, []string{branch}, true)

	// The bundle's pack index gone: only the header's tips pass.
	pushed3 := gitWith(t, env, repo, "", "commit-tree", tip+"^{tree}", "-p", pushed2, "-m", "pushed 3")
	env.Git(repo, "update-ref", "refs/heads/main", pushed3)
	idxs, _ := filepath.Glob(filepath.Join(repo, "objects", "pack", "*.idx"))
	raw, _ := os.ReadFile(filepath.Join(repo, "clone.bundle"))
	for _, p := range idxs {
		if b, _ := os.ReadFile(p); len(b) >= 40 && string(b[len(b)-40:len(b)-20]) == string(raw[len(raw)-20:]) {
			os.Remove(p)
		}
	}
	os.Rename(filepath.Join(repo, "clone.bundle"), filepath.Join(repo, "bundle.tmp")) // a new version of the file
	os.WriteFile(filepath.Join(repo, "clone.bundle"), raw, 0o644)
	check(served, []string{pushed2}, nil, false)
	check(served, []string{pushed1}, nil, true)
}
