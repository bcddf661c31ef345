package backup

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"packwire/internal/lfs"
	"packwire/internal/repo"
	"packwire/internal/store"
)

// Restore rebuilds a data directory from the backup in dir. dataDir must
// not exist or be empty; it is written beside and renamed into place, so a
// failed restore leaves nothing. Object files are hard-linked from the
// backup where they can be (opts.Copy: never); the databases and every
// other file are copied, since SQLite and git rewrite those.
func Restore(ctx context.Context, dir, dataDir string, opts Options) (*Manifest, Stats, error) {
	var stats Stats
	m, err := ReadManifest(dir)
	if err != nil {
		return nil, stats, err
	}
	tmp, err := newTarget(dataDir, ".restoring-")
	if err != nil {
		return nil, stats, fmt.Errorf("restore only into a new or empty directory: %w", err)
	}
	defer os.RemoveAll(tmp)
	ln := &linker{allowed: !opts.Copy, stats: &stats}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		target := filepath.Join(tmp, rel)
		switch {
		case rel == ".":
			return nil
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case rel == ManifestFile || !d.Type().IsRegular():
			return nil
		case isObjectFile(rel):
			return ln.place(p, target)
		}
		return copyFile(p, target, &stats)
	})
	if err != nil {
		return nil, stats, err
	}
	root := repo.Root{Dir: filepath.Join(tmp, "repos")}
	for _, r := range m.Repositories {
		if !repo.IsBare(root.PathFor(r.Name)) {
			return nil, stats, fmt.Errorf("the backup lacks repository %s that its manifest lists", r.Name)
		}
	}
	if _, err := os.Stat(filepath.Join(tmp, storeFile)); err != nil {
		return nil, stats, fmt.Errorf("the backup has no %s", storeFile)
	}
	// The store opens (and moves forward, from an older packwire).
	st, err := store.Open(ctx, filepath.Join(tmp, storeFile))
	if err != nil {
		return nil, stats, err
	}
	if err := st.Close(); err != nil {
		return nil, stats, err
	}
	if err := checkLFSStore(ctx, m, tmp, opts); err != nil {
		return nil, stats, err
	}
	if err := moveIntoPlace(tmp, dataDir, 0o700); err != nil { // as datadir.Create makes it: it holds the store and host keys
		return nil, stats, err
	}
	return m, stats, nil
}

// checkLFSStore checks, for a backup whose LFS objects are in an S3 store,
// that the store (opts.LFSStore, else the one the backup records) holds
// every object the backup's index names: the restored server would
// otherwise serve an index of objects that are not there.
func checkLFSStore(ctx context.Context, m *Manifest, tmp string, opts Options) error {
	url := opts.LFSStore
	if url == "" {
		url = m.LFSStore
	}
	if url == "" {
		return nil
	}
	if _, err := os.Stat(lfs.IndexPath(tmp)); err != nil {
		return fmt.Errorf("the backup records LFS objects in %s but has no LFS index: %w", url, err)
	}
	s3, err := lfs.OpenS3(ctx, url)
	if err != nil {
		return fmt.Errorf("the backup's LFS objects are in an S3 store: %w", err)
	}
	named, missing, listed, err := lfs.Missing(ctx, lfs.IndexPath(tmp), s3, 3)
	if err != nil {
		return fmt.Errorf("checking the LFS objects in %s: %w", url, err)
	}
	if missing > 0 {
		return fmt.Errorf("the backup's LFS index names %d objects, and %d of them are not in %s (%s): restore the bucket from its own backup first (or pass --lfs-store naming one that holds them)",
			named, missing, url, strings.Join(listed, ", "))
	}
	opts.logf("LFS: %d objects, all in %s: serve with --lfs-store %s", named, url, url)
	return nil
}

// isObjectFile is true for files under a repository's objects directory.
func isObjectFile(rel string) bool {
	if strings.HasPrefix(filepath.ToSlash(rel), "lfs/objects/") {
		return true // LFS objects, as immutable as git's
	}
	parts := strings.Split(filepath.ToSlash(rel), "/")
	for i, p := range parts[:len(parts)-1] {
		if p == "objects" && i > 0 && strings.HasSuffix(parts[i-1], ".git") && parts[0] == "repos" {
			return true
		}
	}
	return false
}
