// Package lfs serves Git LFS beside the git pipeline: the batch, object,
// verify and locks APIs over HTTP (api.go, locks.go), git-lfs-authenticate
// over SSH (ssh.go), a content-addressed object store (this file: the
// Store seam and the disk; s3.go: an S3-compatible bucket) and the index
// of which repository holds which object (index.go). The
// transports only route a URL prefix or an SSH command here; access is
// decided with the same access.Controller as git's.
package lfs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// ValidOID reports whether s is an LFS object id: 64 lowercase hex digits
// (SHA-256), the only form the store accepts, so an oid is always a safe
// file name.
func ValidOID(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// Errors of an upload; the API answers 422 for the first two, 413 for the
// third.
var (
	ErrSizeMismatch = errors.New("size mismatch")
	ErrHashMismatch = errors.New("hash mismatch")
	ErrTooLarge     = errors.New("object too large")
)

// Store holds objects' content by oid, once whichever repositories hold
// them (the index decides who may read what).
type Store interface {
	// Stat returns the stored size of oid, or false if it is not stored.
	Stat(oid string) (int64, bool)
	// Open opens oid's content for reading.
	Open(oid string) (io.ReadSeekCloser, fs.FileInfo, error)
	// Put stores exactly size bytes read from r as oid, verified: the
	// object is whole with that SHA-256 under its name, or not there.
	// written is what was read from r.
	Put(oid string, size int64, r io.Reader) (written int64, err error)
	// Remove deletes oid's content (no error if it is not stored).
	Remove(oid string) error
	// Walk calls fn for every stored object, with when it was stored.
	Walk(ctx context.Context, fn func(oid string, size int64, stored time.Time) error) error
	// DownloadURL is a URL good for ttl that serves oid's content without
	// credentials, for a client the index let read it; "" when downloads
	// go through this server.
	DownloadURL(ctx context.Context, oid string, ttl time.Duration) (string, error)
}

// Disk is the local object store: DIR/objects/aa/bb/OID, uploads through
// DIR/tmp on the same file system.
type Disk struct {
	Dir string
}

// NewDisk makes the store's directories and removes temporary files a
// crash left behind (none is ever in use before the server starts).
func NewDisk(dir string) (*Disk, error) {
	for _, d := range []string{"objects", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, err
		}
	}
	d := &Disk{Dir: dir}
	if ents, err := os.ReadDir(filepath.Join(dir, "tmp")); err == nil {
		for _, e := range ents {
			os.Remove(filepath.Join(dir, "tmp", e.Name()))
		}
	}
	return d, nil
}

// Path is where oid's content lives (oid must be valid).
func (d *Disk) Path(oid string) string {
	return filepath.Join(d.Dir, "objects", oid[0:2], oid[2:4], oid)
}

// Stat returns the stored size of oid, or false if it is not stored.
func (d *Disk) Stat(oid string) (int64, bool) {
	fi, err := os.Stat(d.Path(oid))
	if err != nil || !fi.Mode().IsRegular() {
		return 0, false
	}
	return fi.Size(), true
}

// Open opens oid's content for reading (an *os.File: the HTTP download
// reaches sendfile(2)).
func (d *Disk) Open(oid string) (io.ReadSeekCloser, fs.FileInfo, error) {
	f, err := os.Open(d.Path(oid))
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, fi, nil
}

// Put stores exactly size bytes read from r as oid: into a temporary file,
// through SHA-256, then fsync and rename, so the object is either whole
// and verified at its path or not there at all. It reads one byte past
// size to tell a body that is too long. written is what was read from r.
func (d *Disk) Put(oid string, size int64, r io.Reader) (written int64, err error) {
	tmp, err := os.CreateTemp(filepath.Join(d.Dir, "tmp"), oid[:12]+"-*")
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	buf := make([]byte, 32<<10)
	written, err = io.CopyBuffer(io.MultiWriter(tmp, h), io.LimitReader(r, size+1), buf)
	if err != nil {
		return written, err
	}
	if written != size {
		return written, fmt.Errorf("%w: received %d bytes, expected %d", ErrSizeMismatch, written, size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != oid {
		return written, fmt.Errorf("%w: content hashes to %s", ErrHashMismatch, got)
	}
	if err = tmp.Sync(); err != nil {
		return written, err
	}
	if err = tmp.Close(); err != nil {
		return written, err
	}
	final := d.Path(oid)
	if err = os.MkdirAll(filepath.Dir(final), 0o700); err != nil {
		return written, err
	}
	// Same content whoever wins a race: a rename over an existing
	// object replaces it with identical bytes.
	if err = os.Rename(tmp.Name(), final); err != nil {
		return written, err
	}
	syncDir(filepath.Dir(final))
	return written, nil
}

// Remove deletes oid's content (maintenance, once no repository holds it).
func (d *Disk) Remove(oid string) error {
	err := os.Remove(d.Path(oid))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// Walk calls fn for every stored object.
func (d *Disk) Walk(ctx context.Context, fn func(oid string, size int64, stored time.Time) error) error {
	return filepath.WalkDir(filepath.Join(d.Dir, "objects"), func(p string, e fs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() || !ValidOID(e.Name()) {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		fi, err := e.Info()
		if err != nil {
			return nil // removed meanwhile
		}
		return fn(e.Name(), fi.Size(), fi.ModTime())
	})
}

// DownloadURL: a disk's objects are served by this server.
func (d *Disk) DownloadURL(context.Context, string, time.Duration) (string, error) { return "", nil }

// ModTime is when oid was stored (zero if it is not).
func (d *Disk) ModTime(oid string) time.Time {
	fi, err := os.Stat(d.Path(oid))
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}

// syncDir makes a rename into dir durable.
func syncDir(dir string) {
	if f, err := os.Open(dir); err == nil {
		f.Sync()
		f.Close()
	}
}
