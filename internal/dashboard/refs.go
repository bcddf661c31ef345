package dashboard

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"packwire/internal/oid"
)

// refCount is how many refs a repository has, by namespace.
type refCount struct {
	Branches, Tags, Other int
}

func (c refCount) Total() int { return c.Branches + c.Tags + c.Other }

// countRefs counts a bare repository's refs from its files (packed-refs and
// loose refs under refs/, a loose ref standing for a packed one of the same
// name), without spawning git: the Repos page lists every repository.
func countRefs(dir string) (refCount, error) {
	names := map[string]bool{}
	f, err := os.Open(filepath.Join(dir, "packed-refs"))
	switch {
	case err == nil:
		err = parsePackedRefs(f, func(name string) { names[name] = true })
		f.Close()
		if err != nil {
			return refCount{}, err
		}
	case !errors.Is(err, fs.ErrNotExist):
		return refCount{}, err
	}
	refsDir := filepath.Join(dir, "refs")
	err = filepath.WalkDir(refsDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.Type().IsRegular() || strings.HasSuffix(d.Name(), ".lock") {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		names[filepath.ToSlash(rel)] = true
		return nil
	})
	if err != nil {
		return refCount{}, err
	}
	var c refCount
	for name := range names {
		switch {
		case strings.HasPrefix(name, "refs/heads/"):
			c.Branches++
		case strings.HasPrefix(name, "refs/tags/"):
			c.Tags++
		default:
			c.Other++
		}
	}
	return c, nil
}

// parsePackedRefs calls ref for each ref a packed-refs file names: lines
// "<object id> <refname>", after an optional "# pack-refs with:" header,
// each possibly followed by a "^<object id>" peeled line.
func parsePackedRefs(r io.Reader, ref func(name string)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 64<<10)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		if line[0] == '^' {
			if !oid.Valid(line[1:]) {
				return fmt.Errorf("packed-refs line %d: malformed peeled line", n)
			}
			continue
		}
		id, name, ok := bytes.Cut(line, []byte{' '})
		if !ok || !oid.Valid(id) || !bytes.HasPrefix(name, []byte("refs/")) || bytes.ContainsAny(name, " \t\x00") {
			return fmt.Errorf("packed-refs line %d: want \"<object id> refs/...\"", n)
		}
		ref(string(name))
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("packed-refs: %w", err)
	}
	return nil
}
