package repo

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// trashDirName is where deleted repositories wait out their grace period:
// under the root, so that moving one there is a rename(2) on one file
// system, and starting with '.', a name no client can ask for.
const trashDirName = ".trash"

// TrashStamp is the layout of a deletion time in a trashed repository's
// directory name (team/app.20260101T120000Z.git) and of the time that
// Untrash is given to choose among several deleted versions.
const TrashStamp = "20060102T150405Z"

var trashedName = regexp.MustCompile(`^(.+)\.(\d{8}T\d{6}Z)\.git$`)

// ErrNotInTrash is returned when no deleted repository has the name.
var ErrNotInTrash = errors.New("no deleted repository of that name")

// Trashed is a deleted repository kept in the trash.
type Trashed struct {
	Name    string    // its name when it was deleted
	Deleted time.Time // UTC, to the second
	Path    string
}

// Stamp is the deletion time as written in the directory name.
func (t Trashed) Stamp() string { return t.Deleted.Format(TrashStamp) }

// TrashDir is the directory that holds deleted repositories.
func (r Root) TrashDir() string { return filepath.Join(r.Dir, trashDirName) }

// MoveToTrash renames the repository into the trash, stamped with now (a
// second later per deletion of the same name within that second). Clients
// no longer find it from then on. The caller keeps pushes out (repolock).
func (r Root) MoveToTrash(rp Repo, now time.Time) (Trashed, error) {
	now = now.UTC().Truncate(time.Second)
	base := filepath.Join(r.TrashDir(), filepath.FromSlash(rp.Name))
	if err := os.MkdirAll(filepath.Dir(base), 0o755); err != nil {
		return Trashed{}, err
	}
	for i := 0; ; i++ {
		t := Trashed{Name: rp.Name, Deleted: now.Add(time.Duration(i) * time.Second)}
		t.Path = base + "." + t.Stamp() + ".git"
		if _, err := os.Lstat(t.Path); err == nil {
			continue // rename(2) would replace an empty directory: never reuse a name
		}
		if err := os.Rename(rp.Path, t.Path); err != nil {
			return Trashed{}, err
		}
		return t, nil
	}
}

// ListTrash returns the deleted repositories, by name, then oldest first.
func (r Root) ListTrash() ([]Trashed, error) {
	dir := r.TrashDir()
	var list []Trashed
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir && errors.Is(err, fs.ErrNotExist) {
				return filepath.SkipDir // nothing was ever deleted
			}
			return err
		}
		if !d.IsDir() || p == dir {
			return nil
		}
		m := trashedName.FindStringSubmatch(d.Name())
		if m == nil || !IsBare(p) {
			return nil
		}
		rel, _ := filepath.Rel(dir, filepath.Join(filepath.Dir(p), m[1]))
		name, err := CleanName(filepath.ToSlash(rel))
		when, terr := time.Parse(TrashStamp, m[2])
		if err == nil && terr == nil {
			list = append(list, Trashed{Name: name, Deleted: when, Path: p})
		}
		return filepath.SkipDir
	})
	sort.SliceStable(list, func(i, j int) bool {
		if list[i].Name != list[j].Name {
			return list[i].Name < list[j].Name
		}
		return list[i].Deleted.Before(list[j].Deleted)
	})
	return list, err
}

// Untrash moves a deleted repository back under its name, refusing
// (ErrExists) if a repository of that name exists again.
func (r Root) Untrash(t Trashed) (Repo, error) {
	name, path, err := r.prepareNew(t.Name)
	if err != nil {
		return Repo{}, err
	}
	if err := os.Rename(t.Path, path); err != nil {
		return Repo{}, err
	}
	return Repo{Name: name, Path: path}, nil
}

// RemoveTrashed deletes a trashed repository for good.
func (r Root) RemoveTrashed(t Trashed) error {
	rel, err := filepath.Rel(r.TrashDir(), t.Path)
	if err != nil || strings.HasPrefix(rel, "..") {
		return fmt.Errorf("%s is not in the trash", t.Path)
	}
	return os.RemoveAll(t.Path)
}

// Move renames a repository to newRaw: one rename(2) within the root, the
// new name's parent directories created. It refuses (ErrExists) if the new
// name is taken and ErrInvalidName for a bad name or one inside another
// repository. The caller keeps pushes out (repolock).
func (r Root) Move(rp Repo, newRaw string) (Repo, error) {
	name, path, err := r.prepareNew(newRaw)
	if err != nil {
		return Repo{}, err
	}
	if err := os.Rename(rp.Path, path); err != nil {
		return Repo{}, err
	}
	return Repo{Name: name, Path: path}, nil
}

// gitDefaultDescription is what git init writes into description: no
// description at all.
const gitDefaultDescription = "Unnamed repository; edit this file 'description' to name the repository."

// Description is the repository's description file (what gitweb and
// cgit show), "" if there is none.
func Description(rp Repo) string {
	b, err := os.ReadFile(filepath.Join(rp.Path, "description"))
	if err != nil {
		return ""
	}
	d := strings.TrimSpace(string(b))
	if d == gitDefaultDescription {
		return ""
	}
	return d
}

// CleanDescription is text as a description holds it: one line, trimmed.
func CleanDescription(text string) (string, error) {
	text = strings.TrimSpace(text)
	if strings.ContainsAny(text, "\n\r") {
		return "", errors.New("a description is one line")
	}
	return text, nil
}

// SetDescription replaces the repository's description file, whole: it is
// written aside and renamed into place.
func SetDescription(rp Repo, text string) error {
	text, err := CleanDescription(text)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(rp.Path, ".description-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.WriteString(text + "\n"); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), filepath.Join(rp.Path, "description"))
}
