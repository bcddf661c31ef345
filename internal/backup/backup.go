// Package backup writes a consistent snapshot of a packwire data directory
// while the server runs, and rebuilds a data directory from one.
//
// A backup is a directory laid out as a data directory (packwire.db, the
// SSH host keys, repos/NAME.git, optionally governor.db) plus
// manifest.json. The databases are copied with SQLite's VACUUM INTO (a
// transaction's snapshot, whatever writes meanwhile). Each repository is
// copied under its move lock (no delete or rename meanwhile) and its
// maintenance lock (maintenance is the only thing that deletes objects):
// its refs are read first and written as the copy's packed-refs, then its
// objects are copied, so every object those refs reach is in the copy even
// while pushes land (git writes objects before the refs that name them).
// Object files are never changed in place by git, so where the backup is on
// the same file system they are hard-linked instead of copied.
package backup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"packwire/internal/governor"
	"packwire/internal/lfs"
	"packwire/internal/maintain"
	"packwire/internal/repo"
	"packwire/internal/repolock"
	"packwire/internal/store"
	"packwire/internal/units"
)

// ManifestFile describes a backup; its presence makes a directory one.
const ManifestFile = "manifest.json"

// FormatVersion is the layout this package writes and reads.
const FormatVersion = 1

const storeFile = "packwire.db"

// Manifest is what a backup holds.
type Manifest struct {
	Format       int       `json:"format"`
	Version      string    `json:"packwire_version"`
	Created      time.Time `json:"created"`
	Source       string    `json:"source"` // the data directory backed up
	Files        []string  `json:"files"`  // databases and host keys
	Repositories []Repo    `json:"repositories"`
	// LFSStore is the S3 store holding the LFS objects the backup's index
	// names, which a backup lists (the index) and checks but does not
	// copy; "": the objects are in the backup.
	LFSStore string `json:"lfs_store,omitempty"`
	// LFSObjects is how many objects the backup's LFS index names.
	LFSObjects int `json:"lfs_objects,omitempty"`
}

// Repo is one repository in a backup.
type Repo struct {
	Name  string    `json:"name"`
	Head  string    `json:"head"` // HEAD as in the file: "ref: refs/heads/main" or an object id
	Refs  int       `json:"refs"`
	Bytes int64     `json:"bytes"` // its objects
	Taken time.Time `json:"taken"` // when its refs were read
}

// Options tune Create and Restore.
type Options struct {
	Version  string // packwire's version, for the manifest
	Governor bool   // include the request records (governor.db)
	Copy     bool   // copy object files even where a hard link would do
	Verify   bool   // check each repository copy's connectivity (git fsck --connectivity-only)
	// LFSStore is the S3 store (serve's --lfs-store) holding the LFS
	// objects: Create checks it holds every object the index names and
	// records it instead of copying them; Restore checks it (default: the
	// one the backup records) holds them all.
	LFSStore string
	// Log, if set, is told what happens (a repository done, a wait).
	Log func(format string, args ...any)
}

func (o Options) logf(format string, args ...any) {
	if o.Log != nil {
		o.Log(format, args...)
	}
}

// Stats is what a run moved.
type Stats struct {
	Copied, Linked int64 // bytes of files copied and hard-linked
}

// Create writes a backup of dataDir into out, which must not exist or be
// empty. The backup is written beside out and renamed into place at the
// end, so out is a whole backup or nothing.
func Create(ctx context.Context, dataDir, out string, opts Options) (*Manifest, Stats, error) {
	var stats Stats
	src, err := filepath.Abs(dataDir)
	if err != nil {
		return nil, stats, err
	}
	if _, err := os.Stat(filepath.Join(src, storeFile)); err != nil {
		return nil, stats, fmt.Errorf("no packwire data in %s", dataDir)
	}
	tmp, err := newTarget(out, ".partial-")
	if err != nil {
		return nil, stats, err
	}
	defer os.RemoveAll(tmp) // gone once renamed into place
	m := &Manifest{Format: FormatVersion, Version: opts.Version, Created: time.Now().UTC(), Source: src}
	dbs := []string{storeFile}
	if opts.Governor {
		dbs = append(dbs, governor.FileName)
	}
	for _, name := range dbs {
		if _, err := os.Stat(filepath.Join(src, name)); errors.Is(err, fs.ErrNotExist) && name != storeFile {
			opts.logf("%s: none in %s (never served), not included", name, dataDir)
			continue
		}
		if err := vacuumInto(ctx, filepath.Join(src, name), filepath.Join(tmp, name)); err != nil {
			return nil, stats, fmt.Errorf("%s: %w", name, err)
		}
		if fi, err := os.Stat(filepath.Join(tmp, name)); err == nil {
			stats.Copied += fi.Size()
		}
		m.Files = append(m.Files, name)
	}
	keys, _ := filepath.Glob(filepath.Join(src, "ssh_host_*_key"))
	for _, k := range keys {
		if err := copyFile(k, filepath.Join(tmp, filepath.Base(k)), &stats); err != nil {
			return nil, stats, err
		}
		m.Files = append(m.Files, filepath.Base(k))
	}
	ln := &linker{allowed: !opts.Copy, stats: &stats}
	if err := copyLFS(ctx, src, tmp, ln, m, opts); err != nil {
		return nil, stats, fmt.Errorf("LFS: %w", err)
	}
	root := repo.Root{Dir: filepath.Join(src, "repos")}
	repos, err := root.List()
	if err != nil {
		return nil, stats, err
	}
	dstRoot := repo.Root{Dir: filepath.Join(tmp, "repos")}
	if err := os.MkdirAll(dstRoot.Dir, 0o755); err != nil {
		return nil, stats, err
	}
	for _, r := range repos {
		entry, err := copyRepo(ctx, r, dstRoot.PathFor(r.Name), ln, opts)
		if errors.Is(err, repolock.ErrMoved) {
			opts.logf("%s: deleted or renamed during the backup, not included", r.Name)
			continue
		}
		if err != nil {
			return nil, stats, fmt.Errorf("%s: %w", r.Name, err)
		}
		m.Repositories = append(m.Repositories, entry)
		opts.logf("%s: %d refs, %s", entry.Name, entry.Refs, units.Bytes(entry.Bytes))
	}
	if err := writeManifest(filepath.Join(tmp, ManifestFile), m); err != nil {
		return nil, stats, err
	}
	// Private host keys and token hashes: the backup is its owner's alone.
	if err := moveIntoPlace(tmp, out, 0o700); err != nil {
		return nil, stats, err
	}
	return m, stats, nil
}

// copyLFS copies the LFS index (VACUUM INTO), then the objects it names
// (hard links where possible: an object file never changes): an index row
// is written only after its file is in place, so every object the copied
// index names is there to copy. Objects kept in an S3 store
// (opts.LFSStore) are not copied: the store is checked to hold every one
// and recorded in the manifest. Either way a backup whose index names an
// object it cannot bring back is refused, not written.
func copyLFS(ctx context.Context, src, tmp string, ln *linker, m *Manifest, opts Options) error {
	index := lfs.IndexPath(src)
	if _, err := os.Stat(index); errors.Is(err, fs.ErrNotExist) {
		if opts.LFSStore != "" {
			return fmt.Errorf("--lfs-store given, but %s has no LFS index (LFS never ran)", src)
		}
		return nil // LFS never ran
	}
	rel := filepath.Join(filepath.Base(lfs.Dir(src)), lfs.IndexFile)
	if err := os.MkdirAll(filepath.Join(tmp, filepath.Dir(rel)), 0o700); err != nil {
		return err
	}
	if err := vacuumInto(ctx, index, filepath.Join(tmp, rel)); err != nil {
		return err
	}
	m.Files = append(m.Files, filepath.ToSlash(rel))
	var held lfs.Store
	where := "the backup"
	if opts.LFSStore != "" {
		s3, err := lfs.OpenS3(ctx, opts.LFSStore)
		if err != nil {
			return err
		}
		held, where, m.LFSStore = s3, opts.LFSStore, opts.LFSStore
	} else {
		objects := filepath.Join(lfs.Dir(src), "objects")
		if _, err := os.Stat(objects); err == nil {
			before := ln.stats.Linked + ln.stats.Copied
			if err := copyTree(objects, filepath.Join(tmp, filepath.Dir(rel), "objects"), ln, true); err != nil {
				return err
			}
			opts.logf("LFS: %s of objects", units.Bytes(ln.stats.Linked+ln.stats.Copied-before))
		}
		held = &lfs.Disk{Dir: lfs.Dir(tmp)}
	}
	named, missing, listed, err := lfs.Missing(ctx, lfs.IndexPath(tmp), held, 3)
	if err != nil {
		return err
	}
	m.LFSObjects = named
	if missing > 0 {
		hint := ""
		if opts.LFSStore == "" {
			hint = "; if the server keeps LFS objects in an S3 store, pass its --lfs-store to backup"
		}
		return fmt.Errorf("the LFS index names %d objects, and %d of them are not in %s (%s)%s",
			named, missing, where, strings.Join(listed, ", "), hint)
	}
	if opts.LFSStore != "" {
		opts.logf("LFS: %d objects, all in %s (not copied)", named, opts.LFSStore)
	}
	return nil
}

// newTarget checks that dir does not exist or is empty and makes a
// temporary directory beside it, on the same file system, to rename onto
// it once complete.
func newTarget(dir, kind string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if entries, err := os.ReadDir(abs); err == nil && len(entries) > 0 {
		return "", fmt.Errorf("%s is not empty", dir)
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(abs), 0o755); err != nil {
		return "", err
	}
	return os.MkdirTemp(filepath.Dir(abs), "."+filepath.Base(abs)+kind)
}

// moveIntoPlace renames the finished tmp onto dir (an empty dir is
// replaced), with the given mode.
func moveIntoPlace(tmp, dir string, mode os.FileMode) error {
	os.Remove(dir) // only if empty: newTarget checked, and a non-empty one fails the rename
	if err := os.Chmod(tmp, mode); err != nil {
		return err
	}
	return os.Rename(tmp, dir)
}

// vacuumInto writes a consistent copy of the SQLite database at src to dst.
func vacuumInto(ctx context.Context, src, dst string) error {
	if _, err := os.Stat(src); err != nil {
		return err // never create a database by backing it up
	}
	db, err := store.OpenWith(ctx, src, nil)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := store.CreatePrivate(dst); err != nil {
		return err
	}
	_, err = db.DB.ExecContext(ctx, "VACUUM INTO ?", dst)
	return err
}

func writeManifest(path string, m *Manifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// ReadManifest reads a backup's manifest.
func ReadManifest(dir string) (*Manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s is not a packwire backup (no %s)", dir, ManifestFile)
	}
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", ManifestFile, err)
	}
	if m.Format > FormatVersion {
		return nil, fmt.Errorf("%s: format %d is newer than this packwire reads (%d)", ManifestFile, m.Format, FormatVersion)
	}
	return &m, nil
}

// afterRefs, set by tests, runs between reading a repository's refs and
// copying its objects.
var afterRefs func(repo.Repo)

// waitPoll is how often a backup retries a repository that maintenance
// holds: a run takes seconds to minutes.
const waitPoll = 200 * time.Millisecond

// copyRepo copies one repository: refs first, then the objects.
func copyRepo(ctx context.Context, r repo.Repo, dst string, ln *linker, opts Options) (Repo, error) {
	entry := Repo{Name: r.Name}
	held, err := repolock.Shared(ctx, r.Path)
	if err != nil {
		return entry, err
	}
	defer held.Release()
	for waited := false; ; waited = true {
		unlock, err := maintain.Lock(r.Path)
		if err == nil {
			defer unlock()
			break
		}
		if !errors.Is(err, maintain.ErrBusy) {
			return entry, err
		}
		if !waited {
			opts.logf("%s: waiting for its maintenance run to end", r.Name)
		}
		select {
		case <-ctx.Done():
			return entry, ctx.Err()
		case <-time.After(waitPoll):
		}
	}

	head, err := os.ReadFile(filepath.Join(r.Path, "HEAD"))
	if err != nil {
		return entry, err
	}
	entry.Head = strings.TrimSpace(string(head))
	entry.Taken = time.Now().UTC()
	refs, err := git(ctx, r.Path, "for-each-ref", "--format=%(objectname) %(refname)")
	if err != nil {
		return entry, err
	}
	lines := strings.Split(strings.TrimSpace(refs), "\n")
	if lines[0] == "" {
		lines = nil
	}
	// packed-refs sorted by name, byte order, as git writes it.
	sort.Slice(lines, func(i, j int) bool { return refName(lines[i]) < refName(lines[j]) })
	entry.Refs = len(lines)
	packed := "# pack-refs with: sorted \n"
	if len(lines) > 0 {
		packed += strings.Join(lines, "\n") + "\n"
	}

	if afterRefs != nil {
		afterRefs(r)
	}
	for _, d := range []string{"refs/heads", "refs/tags", "objects/pack", "objects/info"} {
		if err := os.MkdirAll(filepath.Join(dst, d), 0o755); err != nil {
			return entry, err
		}
	}
	if err := os.WriteFile(filepath.Join(dst, "HEAD"), head, 0o644); err != nil {
		return entry, err
	}
	if err := os.WriteFile(filepath.Join(dst, "packed-refs"), []byte(packed), 0o644); err != nil {
		return entry, err
	}
	if err := copyRepoFiles(r.Path, dst, ln); err != nil {
		return entry, err
	}
	if entry.Bytes, err = copyObjects(filepath.Join(r.Path, "objects"), filepath.Join(dst, "objects"), ln); err != nil {
		return entry, err
	}
	if opts.Verify {
		if _, err := git(ctx, dst, "fsck", "--connectivity-only", "--no-progress", "--no-dangling"); err != nil {
			return entry, fmt.Errorf("the copy is not whole: %w", err)
		}
	}
	return entry, nil
}

func refName(line string) string {
	_, name, _ := strings.Cut(line, " ")
	return name
}

// copyRepoFiles copies the repository's own files (config, description,
// shallow, packwire's maintenance state, info/): not the refs (packed-refs
// is the snapshot), hooks (packwire runs its own), reflogs, locks or
// temporary files.
func copyRepoFiles(src, dst string, ln *linker) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		switch {
		case name == "info" && e.IsDir():
			if err := copyTree(filepath.Join(src, name), filepath.Join(dst, name), ln, false); err != nil {
				return err
			}
		case !e.Type().IsRegular() || skipFile(name):
		case name == "HEAD" || name == "packed-refs" || name == "FETCH_HEAD" || name == "ORIG_HEAD":
		default:
			if err := copyFile(filepath.Join(src, name), filepath.Join(dst, name), ln.stats); err != nil {
				return err
			}
		}
	}
	return nil
}

// skipFile is true for lock and temporary files, which only mean something
// to the process that made them.
func skipFile(name string) bool {
	return strings.HasSuffix(name, ".lock") || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "tmp_") ||
		strings.HasPrefix(name, maintain.BundleFile) // derived: the next full maintenance run writes it
}

// copyObjects copies an objects directory: loose objects, complete packs
// (.pack with its .idx) with their companions, the multi-pack-index and its
// bitmap, the commit-graph. Push quarantines, temporary files and the .keep
// of a push in progress are left out. It returns the bytes of the copy.
func copyObjects(src, dst string, ln *linker) (int64, error) {
	before := ln.stats.Copied + ln.stats.Linked
	entries, err := os.ReadDir(src)
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		name := e.Name()
		switch {
		case !e.IsDir():
		case name == "pack":
			if err := copyPacks(filepath.Join(src, name), filepath.Join(dst, name), ln); err != nil {
				return 0, err
			}
		case name == "info":
			if err := copyTree(filepath.Join(src, name), filepath.Join(dst, name), ln, true); err != nil {
				return 0, err
			}
		case len(name) == 2 && isHex(name):
			if err := copyTree(filepath.Join(src, name), filepath.Join(dst, name), ln, true); err != nil {
				return 0, err
			}
		}
	}
	return ln.stats.Copied + ln.stats.Linked - before, nil
}

func copyPacks(src, dst string, ln *linker) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, e := range entries {
		have[e.Name()] = true
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		if skipFile(name) || !e.Type().IsRegular() {
			continue
		}
		base, ext, _ := strings.Cut(name, ".")
		switch {
		case strings.HasPrefix(name, "multi-pack-index"):
		case !strings.HasPrefix(base, "pack-"):
			continue
		case !have[base+".pack"] || !have[base+".idx"]:
			continue // still being written: no ref can name its objects yet
		case ext == "keep":
			// receive-pack's keep holds a pack until its push updates refs.
			if b, _ := os.ReadFile(filepath.Join(src, name)); bytes.HasPrefix(b, []byte("receive-pack")) {
				continue
			}
		}
		if err := ln.place(filepath.Join(src, name), filepath.Join(dst, name)); err != nil {
			return err
		}
	}
	return nil
}

// copyTree copies a directory's regular files, recursively, hard-linking
// them when link is set (object files, which git never rewrites in place).
func copyTree(src, dst string, ln *linker, link bool) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case !d.Type().IsRegular() || skipFile(d.Name()):
			return nil
		case link:
			return ln.place(p, target)
		}
		return copyFile(p, target, ln.stats)
	})
}

func isHex(s string) bool {
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// linker hard-links files while it can and copies them from the first
// failure on (another file system, or one without hard links).
type linker struct {
	allowed bool
	stats   *Stats
}

func (l *linker) place(src, dst string) error {
	if l.allowed {
		if err := os.Link(src, dst); err == nil {
			if fi, err := os.Stat(dst); err == nil {
				l.stats.Linked += fi.Size()
			}
			return nil
		}
		l.allowed = false
	}
	return copyFile(src, dst, l.stats)
}

// copyFile copies src to dst with its mode and modification time (git
// expires unreachable loose objects by it).
func copyFile(src, dst string, stats *Stats) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fi.Mode().Perm())
	if err != nil {
		return err
	}
	n, err := io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	stats.Copied += n
	return os.Chtimes(dst, fi.ModTime(), fi.ModTime())
}

// git runs git in dir as packwire's own commands do.
func git(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", append([]string{"-c", "safe.directory=*", "-C", dir}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %v: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}
