// Package repostate stamps the mutable state of a bare repository that
// git's answers depend on (refs, HEAD, config, object layout) from stat
// calls alone, so that caches of those answers notice every change without
// spawning git or reading the refs.
package repostate

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
)

// Config stamps what a capability advertisement depends on: the
// repository's config and the global config files git reads for every
// repository. A change less than RacyWindow before now makes it Racy.
func Config(repoPath string, now time.Time) Stamp {
	d := digest{h: sha256.New()}
	d.stat("config", filepath.Join(repoPath, "config"))
	d.globals()
	return d.stamp(now)
}

// RacyWindow is how recent a change may be before a stamp stops trusting
// it. File times come from a clock that advances in ticks (1-10 ms on
// Linux), so a file changed within the current tick could change again in
// that tick and keep the same time; one changed longer ago than a tick
// cannot (git's "racy git" problem, solved the same way).
const RacyWindow = 50 * time.Millisecond

// Stamp is a digest of a repository's refs, HEAD, config and object layout.
type Stamp struct {
	Digest string // hex SHA-256
	// Racy is set when something changed within RacyWindow of the stamp:
	// a cache must not key anything on it.
	Racy bool
}

// Refs stamps everything a fetch's answer depends on besides the request.
//
// It is complete because every change git makes to these files replaces
// them or their directory entries: a ref update writes "<ref>.lock" and
// renames it over the ref (a new inode, size and time), a new or deleted
// loose ref adds or removes a name under refs/ (and changes its
// directory's time), pack-refs and ref deletions rewrite packed-refs by
// rename, HEAD and config are written by rename too, and packs arrive in
// and leave objects/pack by rename or unlink (its directory time moves).
// So the stamp covers: HEAD (content and stat); packed-refs, config, shallow,
// objects/info/alternates (inode, size, mtime); a walk of refs/ with each
// directory's time and each file's name, inode, size and mtime; the time
// of objects/pack; and the global config files git reads for every
// repository. Not followed: files named by include.path.
//
// A change less than RacyWindow before now makes the stamp Racy.
//
// Where the kernel reports changes (inotify on Linux's local file
// systems: kept.go), the stamp is kept between calls and the repository
// walked again only after something changed in the directories it
// covers: the event is queued by the very system call that made the
// change, so a stamp taken after a push returned always sees the push.
func Refs(repoPath string, now time.Time) (Stamp, error) {
	return keptRefs(repoPath, now)
}

// walks counts the walks of refs/ (kept stamps are not walks), for tests.
var walks atomic.Int64

// walkRefs computes Refs' stamp from the files. watchDir, if not nil, is
// called for each directory the stamp covers before its entries are read,
// and may refuse (then the walk fails with its error). It returns the
// newest time the stamp saw too.
func walkRefs(repoPath string, now time.Time, watchDir func(path string) error) (Stamp, time.Time, error) {
	walks.Add(1)
	if watchDir != nil {
		for _, dir := range []string{"", "objects", filepath.Join("objects", "info"), filepath.Join("objects", "pack")} {
			if err := watchDir(filepath.Join(repoPath, dir)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return Stamp{}, time.Time{}, err
			}
		}
	}
	d := digest{h: sha256.New()}
	head, err := readSmall(filepath.Join(repoPath, "HEAD"))
	if err != nil {
		return Stamp{}, time.Time{}, fmt.Errorf("repository state: %w", err)
	}
	d.field("HEAD", head)
	for _, name := range []string{"HEAD", "packed-refs", "config", "shallow", filepath.Join("objects", "info", "alternates"), filepath.Join("objects", "pack")} {
		d.stat(name, filepath.Join(repoPath, name))
	}
	d.globals()
	refs := filepath.Join(repoPath, "refs")
	err = filepath.WalkDir(refs, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && path != refs {
				return nil // removed while walking: the stamp differs anyway
			}
			return err
		}
		if watchDir != nil && e.IsDir() {
			if err := watchDir(path); err != nil && !(errors.Is(err, fs.ErrNotExist) && path != refs) {
				return err // a ref directory git removed meanwhile is as above
			}
		}
		rel, _ := filepath.Rel(refs, path)
		d.stat("refs/"+filepath.ToSlash(rel), path)
		return nil
	})
	if err != nil {
		return Stamp{}, time.Time{}, fmt.Errorf("repository state: %w", err)
	}
	return d.stamp(now), d.newest, nil
}

// GlobalConfigFiles are the configuration files outside the repository
// that git reads for every repository it serves, as far as packwire's
// environment names them.
func GlobalConfigFiles() []string {
	var files []string
	if os.Getenv("GIT_CONFIG_NOSYSTEM") == "" {
		files = append(files, "/etc/gitconfig")
	}
	if g := os.Getenv("GIT_CONFIG_GLOBAL"); g != "" {
		return append(files, g)
	}
	if x := os.Getenv("XDG_CONFIG_HOME"); x != "" {
		files = append(files, filepath.Join(x, "git", "config"))
	} else if home, err := os.UserHomeDir(); err == nil {
		files = append(files, filepath.Join(home, ".config", "git", "config"))
	}
	if home, err := os.UserHomeDir(); err == nil {
		files = append(files, filepath.Join(home, ".gitconfig"))
	}
	return files
}

// digest hashes length-prefixed fields and remembers the newest time.
type digest struct {
	h      hash.Hash
	newest time.Time
}

func (d *digest) field(name string, value []byte) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(name)))
	d.h.Write(n[:])
	io.WriteString(d.h, name)
	binary.BigEndian.PutUint64(n[:], uint64(len(value)))
	d.h.Write(n[:])
	d.h.Write(value)
}

func (d *digest) globals() {
	for _, path := range GlobalConfigFiles() {
		d.stat("global:"+path, path)
	}
}

// globalsStat is what lstat says of the global config files now, so that
// a kept stamp notices a change there (they lie outside the watched
// directories).
func globalsStat() string {
	var b []byte
	for _, path := range GlobalConfigFiles() {
		fi, err := os.Lstat(path)
		if err != nil {
			b = append(b, 0)
			continue
		}
		b = binary.BigEndian.AppendUint64(b, inode(fi))
		b = binary.BigEndian.AppendUint64(b, uint64(fi.Size()))
		b = binary.BigEndian.AppendUint64(b, uint64(fi.ModTime().UnixNano()))
		b = binary.BigEndian.AppendUint64(b, uint64(changeTime(fi).UnixNano()))
	}
	return string(b)
}

func (d *digest) stamp(now time.Time) Stamp {
	return Stamp{Digest: hex.EncodeToString(d.h.Sum(nil)), Racy: racy(d.newest, now)}
}

// racy tells whether a change at newest is too recent to trust at now. A
// time in the future (another clock, a skewed file server) is racy too.
func racy(newest, now time.Time) bool { return !newest.Before(now.Add(-RacyWindow)) }

// stat adds what lstat says of path (or that it is missing) under name.
func (d *digest) stat(name, path string) {
	fi, err := os.Lstat(path)
	if err != nil {
		d.field(name, []byte("missing"))
		return
	}
	mtime, ctime := fi.ModTime(), changeTime(fi)
	for _, t := range []time.Time{mtime, ctime} {
		if t.After(d.newest) {
			d.newest = t
		}
	}
	var b [33]byte
	binary.BigEndian.PutUint64(b[0:], inode(fi))
	binary.BigEndian.PutUint64(b[8:], uint64(fi.Size()))
	binary.BigEndian.PutUint64(b[16:], uint64(mtime.UnixNano()))
	binary.BigEndian.PutUint64(b[24:], uint64(ctime.UnixNano()))
	b[32] = byte(fi.Mode().Type() >> 24)
	d.field(name, b[:])
}

// readSmall reads a file of at most 64 KiB (HEAD is one line).
func readSmall(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, 64<<10))
}
