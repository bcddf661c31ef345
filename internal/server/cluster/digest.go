package cluster

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"packwire/internal/oid"
)

// The cluster's promise rests on one rule: a copy is recorded at
// generation G only when its refs are exactly G's. Each generation's row
// carries the digest of its ref set (RefDigest), written in the same
// statement as the generation; a copy is recorded at G only when the
// digest of its own refs, read after its writes, is G's
// (docs/ARCHITECTURE.md, "The cluster's promise").
//
// The ref set is every ref under refs/ but the nodes' own (LocalRefs),
// each as the object id it resolves to (a symbolic ref as its target's,
// as git for-each-ref and a fetch see it); HEAD is not in it (HEAD's
// branch is a setting of its own, SetSettings).

// ErrNotTheRefs: a copy's refs are not the generation's it was to be
// recorded at.
var ErrNotTheRefs = errors.New("its refs are not the generation's")

// RefDigest is the digest of a ref set: SHA-256, in hex, of its
// "refname SP id LF" lines sorted by name.
func RefDigest(refs map[string]string) string {
	names := make([]string, 0, len(refs))
	for name := range refs {
		names = append(names, name)
	}
	sort.Strings(names)
	h := sha256.New()
	for _, name := range names {
		h.Write([]byte(name + " " + refs[name] + "\n"))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// EmptyDigest is the digest of no refs: a new repository's generation 0.
var EmptyDigest = RefDigest(nil)

// Apply is refs with updates made: a zero new value deletes.
func Apply(refs map[string]string, updates []Update) map[string]string {
	out := make(map[string]string, len(refs)+len(updates))
	for k, v := range refs {
		out[k] = v
	}
	for _, u := range updates {
		if IsZero(u.New) {
			delete(out, u.Ref)
		} else {
			out[u.Ref] = u.New
		}
	}
	return out
}

// CopyDigest is the digest of the refs of the copy at gitDir (CopyRefs).
func CopyDigest(gitDir string) (string, error) {
	refs, err := CopyRefs(gitDir)
	if err != nil {
		return "", err
	}
	return RefDigest(refs), nil
}

// CopyRefs reads the ref set of the copy at gitDir from git's files
// (loose refs over packed-refs; a git process per push would cost
// milliseconds on every copy). The loose refs are read first and
// packed-refs after, again if packed-refs changed meanwhile: git's
// pack-refs writes packed-refs before it removes the loose files, so a
// ref is always found in one of them. Lock files (a transaction in
// progress) are skipped: the value is the committed one.
func CopyRefs(gitDir string) (map[string]string, error) {
	for attempt := 0; ; attempt++ {
		before, _ := os.Stat(filepath.Join(gitDir, "packed-refs"))
		loose, err := looseRefs(gitDir)
		if err != nil {
			return nil, err
		}
		packed, after, err := readPacked(gitDir)
		if err != nil {
			return nil, err
		}
		if !sameFile(before, after) && attempt < 5 {
			continue
		}
		symbolic := map[string]string{}
		for name, v := range loose {
			if target, ok := strings.CutPrefix(v, "ref: "); ok {
				symbolic[name] = strings.TrimSpace(target)
				delete(loose, name)
				continue
			}
			packed[name] = v
		}
		// A symbolic ref counts as the id it resolves to; a dangling one
		// not at all (git for-each-ref skips it too).
		for name, target := range symbolic {
			for hops := 0; hops < 5; hops++ {
				if next, ok := symbolic[target]; ok {
					target = next
					continue
				}
				break
			}
			if id, ok := packed[target]; ok {
				packed[name] = id
			}
		}
		// Only after resolving: a symbolic ref may point at the nodes' own
		// or at a ref read from a loose file.
		for name := range packed {
			if strings.HasPrefix(name, LocalRefs) {
				delete(packed, name)
			}
		}
		return packed, nil
	}
}

func sameFile(a, b os.FileInfo) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return os.SameFile(a, b) && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime())
}

// looseRefs reads the loose ref files under gitDir/refs: name -> id, or
// "ref: target" for a symbolic ref.
func looseRefs(gitDir string) (map[string]string, error) {
	refs := map[string]string{}
	err := filepath.WalkDir(filepath.Join(gitDir, "refs"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // deleted while walking
			}
			return err
		}
		if d.IsDir() || strings.HasSuffix(path, ".lock") {
			return nil
		}
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(gitDir, path)
		if err != nil {
			return err
		}
		v := strings.TrimSpace(string(b))
		if oid.Valid(v) || strings.HasPrefix(v, "ref: ") {
			refs[filepath.ToSlash(rel)] = v
		}
		return nil
	})
	return refs, err
}

// readPacked reads gitDir's packed-refs (name -> id; peeled lines left
// out) and the file's info as opened (nil: none).
func readPacked(gitDir string) (map[string]string, os.FileInfo, error) {
	refs := map[string]string{}
	f, err := os.Open(filepath.Join(gitDir, "packed-refs"))
	if errors.Is(err, fs.ErrNotExist) {
		return refs, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || strings.HasPrefix(line, "^") {
			continue
		}
		if id, name, ok := strings.Cut(line, " "); ok && oid.Valid(id) {
			refs[name] = id
		}
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("reading packed-refs: %w", err)
	}
	return refs, info, nil
}

// ShortDigest is a digest as printed (cluster status, verify).
func ShortDigest(d string) string {
	if len(d) > 16 {
		return d[:16]
	}
	return d
}
