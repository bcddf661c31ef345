package route

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// migrate moves the quarantine's objects into the repository's, as
// receive-pack does: loose objects, then packs, each pack's index last
// (a pack is used once its index is there).
func migrate(quarantine, objects string) error {
	entries, err := os.ReadDir(quarantine)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.IsDir() || len(e.Name()) != 2 || !validHex(e.Name()) {
			continue
		}
		sub, err := os.ReadDir(filepath.Join(quarantine, e.Name()))
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Join(objects, e.Name()), 0o755); err != nil {
			return err
		}
		for _, o := range sub {
			dst := filepath.Join(objects, e.Name(), o.Name())
			if _, err := os.Lstat(dst); err == nil {
				continue // already here: objects are immutable
			}
			if err := os.Rename(filepath.Join(quarantine, e.Name(), o.Name()), dst); err != nil {
				return err
			}
		}
	}
	files, err := os.ReadDir(filepath.Join(quarantine, "pack"))
	if err != nil {
		return err
	}
	rank := func(name string) int {
		if strings.HasSuffix(name, ".idx") {
			return 1
		}
		return 0
	}
	sort.SliceStable(files, func(i, j int) bool { return rank(files[i].Name()) < rank(files[j].Name()) })
	for _, f := range files {
		if err := os.Rename(filepath.Join(quarantine, "pack", f.Name()), filepath.Join(objects, "pack", f.Name())); err != nil {
			return err
		}
	}
	return nil
}

func validHex(s string) bool {
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return s != ""
}
