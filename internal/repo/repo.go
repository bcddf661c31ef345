// Package repo maps the repository names clients ask for onto bare
// repositories under one root directory, and refuses anything that could
// reach outside it (.., absolute paths, symlinks, non-bare directories).
package repo

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

var (
	// ErrInvalidName is returned for names that are not a clean relative path.
	ErrInvalidName = errors.New("invalid repository name")
	// ErrNotFound is returned when no bare repository exists under the name.
	ErrNotFound = errors.New("repository not found")
	// ErrExists is returned by Create and Import when the name is taken.
	ErrExists = errors.New("repository already exists")
)

// Root is the directory that holds every served bare repository, each as
// NAME.git (nested names are directories: team/app -> team/app.git).
type Root struct {
	Dir string
	// DefaultBranch is the branch new repositories' HEAD names ("":
	// DefaultBranch).
	DefaultBranch string
}

// Repo is one resolved repository.
type Repo struct {
	Name string // canonical name, without .git: "team/app"
	Path string // absolute path of the bare repository directory
}

// CleanName turns what a client sent ("/team/app.git/", "~/x", "team/app")
// into a canonical name, or returns ErrInvalidName. Every path segment must
// be made of letters, digits, '.', '_' and '-', and must not start with '.'
// so that "..", ".git" and hidden directories can never be named.
func CleanName(raw string) (string, error) {
	name := strings.Trim(raw, "/")
	name = strings.TrimSuffix(name, ".git")
	if name == "" || len(name) > 255 {
		return "", ErrInvalidName
	}
	for _, seg := range strings.Split(name, "/") {
		if seg == "" || seg[0] == '.' || seg[0] == '-' {
			return "", ErrInvalidName
		}
		for _, c := range seg {
			ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
			if !ok {
				return "", ErrInvalidName
			}
		}
		if strings.HasSuffix(seg, ".git") && seg != name[strings.LastIndex(name, "/")+1:] {
			// "a.git/b" would nest a repository inside another's git directory.
			return "", ErrInvalidName
		}
	}
	return name, nil
}

// Resolve finds the bare repository a client asked for. It accepts the name
// with or without ".git" and with leading or trailing slashes.
func (r Root) Resolve(raw string) (Repo, error) {
	name, err := CleanName(raw)
	if err != nil {
		return Repo{}, err
	}
	root, err := filepath.EvalSymlinks(r.Dir)
	if err != nil {
		return Repo{}, fmt.Errorf("repository root: %w", err)
	}
	for _, candidate := range []string{name + ".git", name} {
		p := filepath.Join(root, filepath.FromSlash(candidate))
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			continue
		}
		// A symlink may only lead to another place inside the root.
		rel, err := filepath.Rel(root, real)
		if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			continue
		}
		if !IsBare(real) {
			continue
		}
		// On a case-insensitive file system (macOS, Windows) "TEAM/SECRET"
		// reaches team/secret.git: spell the name as the directory entries
		// are, or access would be decided on the client's spelling.
		spelled, err := onDiskSpelling(osDirs{}, root, rel)
		if err != nil {
			continue
		}
		nameRel := spelled
		if candidate != name { // its ".git" may be stored as ".GIT"
			nameRel = spelled[:len(spelled)-len(".git")] + ".git"
		}
		// The name is where the repository really is: access is decided on
		// it, so a symlink can never lend one repository another's rules.
		canonical, err := CleanName(filepath.ToSlash(nameRel))
		if err != nil {
			continue
		}
		return Repo{Name: canonical, Path: filepath.Join(root, spelled)}, nil
	}
	return Repo{}, ErrNotFound
}

// dirs is what onDiskSpelling reads of the file system: the real one, or
// in tests one that folds case.
type dirs interface {
	Lstat(path string) (os.FileInfo, error)
	Names(dir string) ([]string, error) // the directory's entries as stored
}

type osDirs struct{}

func (osDirs) Lstat(path string) (os.FileInfo, error) { return os.Lstat(path) }

func (osDirs) Names(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}

// onDiskSpelling spells rel, a path of existing entries under root (no
// symlinks left), segment by segment as the entries are stored.
func onDiskSpelling(fsys dirs, root, rel string) (string, error) {
	segs := strings.Split(rel, string(filepath.Separator))
	dir := root
	for i, seg := range segs {
		spelled, err := entryName(fsys, dir, seg)
		if err != nil {
			return "", err
		}
		segs[i] = spelled
		dir = filepath.Join(dir, spelled)
	}
	return strings.Join(segs, string(filepath.Separator)), nil
}

// entryName returns how the existing entry seg of dir is stored. The
// directory is read only when seg in other letter cases resolves too, so
// on a case-sensitive file system this costs one failed Lstat. Then the
// exact name wins (two case variants on a case-sensitive file system are
// distinct), else the one entry equal to seg but for case.
func entryName(fsys dirs, dir, seg string) (string, error) {
	other := swapCase(seg)
	if other == seg {
		return seg, nil // no letters
	}
	if _, err := fsys.Lstat(filepath.Join(dir, other)); err != nil {
		return seg, nil
	}
	names, err := fsys.Names(dir)
	if err != nil {
		return "", err
	}
	match := ""
	for _, n := range names {
		if n == seg {
			return seg, nil
		}
		if strings.EqualFold(n, seg) {
			if match != "" {
				return "", fmt.Errorf("%q and %q in %s both match %q", match, n, dir, seg)
			}
			match = n
		}
	}
	if match == "" {
		return "", fmt.Errorf("%q not listed in %s", seg, dir)
	}
	return match, nil
}

// swapCase turns ASCII upper case into lower and lower into upper.
func swapCase(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case 'a' <= c && c <= 'z':
			b[i] = c - 'a' + 'A'
		case 'A' <= c && c <= 'Z':
			b[i] = c - 'A' + 'a'
		}
	}
	return string(b)
}

// IsBare reports whether dir is itself a git directory (HEAD, objects and
// refs inside it), which is what a bare repository is. A work tree with a
// .git inside does not qualify.
func IsBare(dir string) bool {
	for _, part := range []string{"HEAD", "objects", "refs"} {
		if _, err := os.Lstat(filepath.Join(dir, part)); err != nil {
			return false
		}
	}
	return true
}

// PathFor returns where a repository of this canonical name lives.
func (r Root) PathFor(name string) string {
	return filepath.Join(r.Dir, filepath.FromSlash(name)+".git")
}

// Create makes an empty bare repository.
func (r Root) Create(ctx context.Context, raw string) (Repo, error) {
	name, path, err := r.prepareNew(raw)
	if err != nil {
		return Repo{}, err
	}
	tmp, err := r.tempDir()
	if err != nil {
		return Repo{}, err
	}
	defer os.RemoveAll(tmp)
	branch := r.DefaultBranch
	if branch == "" {
		branch = DefaultBranch
	}
	if err := CheckBranch(branch); err != nil {
		return Repo{}, err
	}
	if out, err := exec.CommandContext(ctx, "git", "init", "--bare", "--quiet", "--initial-branch="+branch, tmp).CombinedOutput(); err != nil {
		return Repo{}, fmt.Errorf("git init: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if err := os.Rename(tmp, path); err != nil {
		return Repo{}, err
	}
	return Repo{Name: name, Path: path}, nil
}

// Import makes a bare mirror of source (a local path or any URL git clones
// from). On failure nothing is left behind.
func (r Root) Import(ctx context.Context, raw, source string) (Repo, error) {
	return r.ImportWith(ctx, raw, source, ImportOptions{})
}

// ImportOptions change how ImportWith clones.
type ImportOptions struct {
	GitArgs []string // before "clone": -c settings such as a credential helper
	Env     []string // added to git's environment
	// Finish, if set, runs on the clone before it is renamed into place
	// (a pull mirror keeps its remote and says what it mirrors); without
	// it the remote is removed.
	Finish func(ctx context.Context, dir string) error
}

// ImportWith is Import with options.
func (r Root) ImportWith(ctx context.Context, raw, source string, opts ImportOptions) (Repo, error) {
	name, path, err := r.prepareNew(raw)
	if err != nil {
		return Repo{}, err
	}
	tmp, err := r.tempDir()
	if err != nil {
		return Repo{}, err
	}
	defer os.RemoveAll(tmp)
	os.Remove(tmp) // git clone wants to create it
	cmd := exec.CommandContext(ctx, "git", append(slices.Clone(opts.GitArgs), "clone", "--mirror", "--quiet", "--", source, tmp)...)
	if opts.Env != nil {
		cmd.Env = append(os.Environ(), opts.Env...)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return Repo{}, fmt.Errorf("git clone --mirror %s: %v: %s", source, err, strings.TrimSpace(string(out)))
	}
	if opts.Finish != nil {
		if err := opts.Finish(ctx, tmp); err != nil {
			return Repo{}, err
		}
	} else {
		// A mirror would keep fetching from its source on "git remote
		// update"; the served copy is the repository of record now.
		exec.CommandContext(ctx, "git", "-C", tmp, "remote", "remove", "origin").Run()
	}
	if err := os.Rename(tmp, path); err != nil {
		return Repo{}, err
	}
	return Repo{Name: name, Path: path}, nil
}

// tempDir makes a directory under DIR/.tmp, a name no client can ask for
// (segments starting with '.' are invalid), so a repository appears whole
// or not at all when it is renamed into place.
func (r Root) tempDir() (string, error) {
	base := filepath.Join(r.Dir, ".tmp")
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", err
	}
	return os.MkdirTemp(base, "new-")
}

func (r Root) prepareNew(raw string) (name, path string, err error) {
	name, err = CleanName(raw)
	if err != nil {
		return "", "", err
	}
	if _, err := r.Resolve(name); err == nil {
		return "", "", ErrExists
	}
	path = r.PathFor(name)
	if _, err := os.Lstat(path); err == nil {
		return "", "", ErrExists
	}
	// Refuse to nest a repository inside another one ("app" then "app/x").
	for parent := filepath.Dir(name); parent != "."; parent = filepath.Dir(parent) {
		if _, err := r.Resolve(parent); err == nil {
			return "", "", fmt.Errorf("%w: %q is inside repository %q", ErrInvalidName, name, parent)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", "", err
	}
	return name, path, nil
}

// List returns every bare repository under the root, sorted by name.
func (r Root) List() ([]Repo, error) {
	var repos []Repo
	err := filepath.WalkDir(r.Dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() || p == r.Dir {
			return nil
		}
		if IsBare(p) {
			rel, _ := filepath.Rel(r.Dir, p)
			if name, err := CleanName(filepath.ToSlash(rel)); err == nil {
				repos = append(repos, Repo{Name: name, Path: p})
			}
			return filepath.SkipDir
		}
		if strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		return nil
	})
	return repos, err
}

// RemoveStaleLocks removes the lock files git left in r's refs (a ref's
// .lock, packed-refs.lock, HEAD.lock) that are older than before: a git
// killed while it held them (a server killed mid-push) leaves them, and
// every later update of those refs would fail with "cannot lock ref".
// Called at server start, before any git runs, with the start time.
func RemoveStaleLocks(r Repo, before time.Time) (int, error) {
	removed := 0
	remove := func(path string) error {
		fi, err := os.Lstat(path)
		if err != nil || !fi.Mode().IsRegular() || !fi.ModTime().Before(before) {
			return nil
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		removed++
		return nil
	}
	for _, f := range []string{"packed-refs.lock", "HEAD.lock"} {
		if err := remove(filepath.Join(r.Path, f)); err != nil {
			return removed, err
		}
	}
	err := filepath.WalkDir(filepath.Join(r.Path, "refs"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // a ref directory removed meanwhile
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".lock") {
			return remove(path)
		}
		return nil
	})
	return removed, err
}
