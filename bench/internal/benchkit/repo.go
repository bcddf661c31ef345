package benchkit

import (
	"bytes"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
)

// BuildRepo makes a deterministic benchmark repository from a source tree:
// the tree arrives over 60 commits, then edits commits each change three
// files, with tags and a few branches, packed as git gc would (with bitmap).
func BuildRepo(src, out string, edits int) error {

	var files []string
	filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			files = append(files, p)
		}
		return nil
	})
	sort.Strings(files)
	if err := exec.Command("git", "init", "-q", "--bare", out).Run(); err != nil {
		return err
	}
	var in bytes.Buffer
	mark, when := 0, 1700000000
	commit := func(msg string) {
		mark++
		fmt.Fprintf(&in, "commit refs/heads/main\nmark :%d\ncommitter Bench <bench@example.com> %d +0000\ndata %d\n%s\n", mark, when+mark*600, len(msg), msg)
		if mark > 1 {
			fmt.Fprintf(&in, "from :%d\n", mark-1)
		}
	}
	blob := func(path string, b []byte) {
		fmt.Fprintf(&in, "M 100644 inline %s\ndata %d\n", path, len(b))
		in.Write(b)
		in.WriteByte('\n')
	}
	contents := map[string][]byte{}
	const chunks = 60
	for c := 0; c < chunks; c++ {
		commit(fmt.Sprintf("import part %d", c))
		for i := c * len(files) / chunks; i < (c+1)*len(files)/chunks; i++ {
			b, err := os.ReadFile(files[i])
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(src, files[i])
			contents[rel] = b
			blob(rel, b)
		}
	}
	names := make([]string, 0, len(contents))
	for n := range contents {
		names = append(names, n)
	}
	sort.Strings(names)
	rng := rand.New(rand.NewPCG(1, 2))
	for e := 0; e < edits; e++ {
		commit(fmt.Sprintf("edit %d", e))
		for k := 0; k < 3; k++ {
			n := names[rng.IntN(len(names))]
			b := contents[n]
			at := bytes.IndexByte(b[len(b)/2:], '\n')
			if at < 0 {
				at = 0
			}
			at += len(b) / 2
			edited := append(append(append([]byte{}, b[:at]...), fmt.Sprintf("\n// edit %d\n", e)...), b[at:]...)
			contents[n] = edited
			blob(n, edited)
		}
		if e%50 == 0 {
			fmt.Fprintf(&in, "tag v0.%d\nfrom :%d\ntagger Bench <bench@example.com> %d +0000\ndata 8\nrelease\n", e/50, mark, when+mark*600)
		}
	}
	for b := 0; b < 3; b++ {
		fmt.Fprintf(&in, "reset refs/heads/release-%d\nfrom :%d\n", b, mark-b*40)
	}
	cmd := exec.Command("git", "fast-import", "--quiet")
	cmd.Dir = out
	cmd.Stdin = &in
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("fast-import: %w", err)
	}
	repack := exec.Command("git", "-C", out, "repack", "-adbq", "--write-bitmap-index")
	repack.Stderr = os.Stderr
	return repack.Run()
}
