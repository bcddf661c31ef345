// Package repolock keeps a repository where it is while a process works in
// it. Pushes, maintenance and backups hold a shared lock on a file inside
// the repository for as long as they work there; `repo delete` and `repo
// rename`, which move the directory and run in another process than the
// server, take it exclusively without waiting, so they are refused while
// anyone works in the repository. The lock is an flock (LockFileEx on
// Windows): the kernel drops it when a holder dies, so a killed push never
// leaves a repository locked. Serial takes another file of the repository
// the same way, exclusively and waiting, for work that must not overlap
// itself across processes.
package repolock

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"
)

// FileName is the lock file in the repository directory. It moves with the
// directory, so a holder can tell whether the repository is still where it
// opened it.
const FileName = "packwire-move.lock"

var (
	// ErrBusy is returned when the lock is held in a conflicting mode.
	ErrBusy = errors.New("repository in use")
	// ErrMoved is returned when the repository is no longer at the path:
	// deleted or renamed before the lock was taken.
	ErrMoved = errors.New("repository moved or deleted")
)

// Lock is a held lock; Release gives it up.
type Lock struct {
	f *os.File
}

// Release unlocks and closes the lock file. A nil Lock is a no-op.
func (l *Lock) Release() {
	if l == nil || l.f == nil {
		return
	}
	unlock(l.f)
	l.f.Close()
	l.f = nil
}

// pollInterval is how often Shared retries while a mover holds the lock:
// a move holds it for one rename, milliseconds.
const pollInterval = 5 * time.Millisecond

// Shared takes the lock shared, waiting while a delete or rename holds it
// (until ctx ends). It fails with ErrMoved if the repository left dir
// before the lock was held; once it is held, the repository stays.
func Shared(ctx context.Context, dir string) (*Lock, error) {
	for {
		l, err := take(dir, FileName, false)
		if !errors.Is(err, ErrBusy) {
			return l, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(pollInterval):
		}
	}
}

// TryShared takes the lock shared, or fails with ErrBusy at once while a
// delete or rename holds it.
func TryShared(dir string) (*Lock, error) { return take(dir, FileName, false) }

// TryExclusive takes the lock exclusively for a move, or fails with ErrBusy
// at once while anyone holds it.
func TryExclusive(dir string) (*Lock, error) { return take(dir, FileName, true) }

// Serial takes an exclusive lock on the file name in dir (not the move
// lock), waiting until ctx ends while another holder has it, in this
// process or another: for work on one repository that must not overlap
// itself, such as a pull mirror's sync (internal/mirror), which both the
// server's scheduler and the `repo sync` command run. The wait is the
// kernel's (a blocking flock), not a poll, so a holder that takes the lock
// again at once cannot keep a waiter out for long.
func Serial(ctx context.Context, dir, name string) (*Lock, error) {
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrMoved
	}
	if err != nil {
		return nil, err
	}
	got := make(chan error, 1)
	go func() { got <- waitLock(f) }()
	select {
	case err = <-got:
	case <-ctx.Done():
		// The wait cannot be cut short: the lock is given up once it comes.
		go func() {
			if <-got == nil {
				unlock(f)
			}
			f.Close()
		}()
		return nil, ctx.Err()
	}
	if err == nil && !still(f, path) {
		unlock(f)
		err = ErrMoved
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Lock{f: f}, nil
}

// still tells whether the open file f is still the one at path.
func still(f *os.File, path string) bool {
	held, err1 := f.Stat()
	now, err2 := os.Stat(path)
	return err1 == nil && err2 == nil && os.SameFile(held, now)
}

func take(dir, name string, exclusive bool) (*Lock, error) {
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrMoved // the directory itself is gone
	}
	if err != nil {
		return nil, err
	}
	if err := tryLock(f, exclusive); err != nil {
		f.Close()
		return nil, err
	}
	// Opened, then moved away before the lock was ours: the file we hold
	// is no longer the one at path.
	if !still(f, path) {
		unlock(f)
		f.Close()
		return nil, ErrMoved
	}
	return &Lock{f: f}, nil
}
