package push

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// gitPack builds packs with git itself: a full one with deltas (OFS_DELTA)
// and a thin one whose deltas name their base by id (REF_DELTA).
func gitPack(t testing.TB) (full, thin []byte) {
	t.Helper()
	dir := t.TempDir()
	git := func(stdin string, args ...string) []byte {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir, "GIT_AUTHOR_NAME=a", "GIT_AUTHOR_EMAIL=a@b", "GIT_COMMITTER_NAME=a", "GIT_COMMITTER_EMAIL=a@b")
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("git %v: %v", args, err)
		}
		return out
	}
	git("", "init", "-q")
	text := strings.Repeat("line of text that deltas well\n", 400)
	for i := 0; i < 4; i++ {
		os.WriteFile(filepath.Join(dir, "f"), []byte(text+strings.Repeat("x", i)), 0o644)
		git("", "add", "f")
		git("", "commit", "-qm", "c")
	}
	full = git("HEAD\n", "pack-objects", "--stdout", "--revs")
	thin = git("HEAD\n^HEAD~1\n", "pack-objects", "--stdout", "--revs", "--thin")
	return full, thin
}

func TestSkipPack(t *testing.T) {
	full, thin := gitPack(t)
	for name, pack := range map[string][]byte{"full": full, "thin": thin} {
		r := bufio.NewReader(bytes.NewReader(append(append([]byte(nil), pack...), "AFTER"...)))
		n, err := SkipPack(r, 20, 1<<20)
		if err != nil || n != int64(len(pack)) {
			t.Fatalf("%s: n=%d of %d, err=%v", name, n, len(pack), err)
		}
		rest := make([]byte, 5)
		if _, err := r.Read(rest); err != nil || string(rest) != "AFTER" {
			t.Fatalf("%s: read past the trailer: %q", name, rest)
		}
	}
	bad := map[string][]byte{
		"no signature":  []byte("PUCK\x00\x00\x00\x02\x00\x00\x00\x00"),
		"version 9":     []byte("PACK\x00\x00\x00\x09\x00\x00\x00\x00"),
		"type 5":        []byte("PACK\x00\x00\x00\x02\x00\x00\x00\x01\x50"),
		"truncated":     full[:len(full)-25],
		"no trailer":    full[:len(full)-20],
		"header only":   full[:12],
		"size mismatch": append(append([]byte(nil), full[:12]...), 0x35, 0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01),
	}
	for name, pack := range bad {
		if _, err := SkipPack(bufio.NewReader(bytes.NewReader(pack)), 20, 1<<20); !errors.Is(err, ErrBadPack) {
			t.Errorf("%s: err = %v, want ErrBadPack", name, err)
		}
	}
}

// TestSkipPackBomb: a zlib bomb (a blob that inflates 1000-fold) stops at
// the inflate budget instead of costing CPU in proportion to its claim.
func TestSkipPackBomb(t *testing.T) {
	var z bytes.Buffer
	zw, _ := newZlibWriter(&z)
	zeros := make([]byte, 1<<20)
	const size = 64 << 20
	for i := 0; i < size>>20; i++ {
		zw.Write(zeros)
	}
	zw.Close()
	pack := []byte("PACK\x00\x00\x00\x02\x00\x00\x00\x01")
	// blob header with size 64 MiB: type 3, size in 4 + 7*n bits.
	s := uint64(size)
	c := byte(objBlob<<4) | byte(s&0x0f)
	s >>= 4
	for s > 0 {
		pack = append(pack, c|0x80)
		c = byte(s & 0x7f)
		s >>= 7
	}
	pack = append(pack, c)
	pack = append(pack, z.Bytes()...)
	pack = append(pack, make([]byte, 20)...)
	if _, err := SkipPack(bufio.NewReader(bytes.NewReader(pack)), 20, 1<<20); err == nil || !strings.Contains(err.Error(), "inflates to more than") {
		t.Fatalf("bomb: err = %v", err)
	}
	if _, err := SkipPack(bufio.NewReader(bytes.NewReader(pack)), 20, 1<<30); err != nil {
		t.Fatalf("the same pack within a large budget: %v", err)
	}
}

func FuzzSkipPack(f *testing.F) {
	full, thin := gitPack(f)
	f.Add(full)
	f.Add(thin)
	f.Add([]byte("PACK\x00\x00\x00\x02\x00\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := SkipPack(bufio.NewReader(bytes.NewReader(data)), 20, 1<<20)
		if n > int64(len(data)) {
			t.Fatalf("read %d of %d bytes", n, len(data))
		}
		if err == nil && n < 32 {
			t.Fatalf("accepted %d bytes as a pack", n)
		}
	})
}

func newZlibWriter(w *bytes.Buffer) (*zlib.Writer, error) {
	return zlib.NewWriterLevel(w, zlib.BestCompression)
}
