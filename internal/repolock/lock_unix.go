//go:build unix

package repolock

import (
	"errors"
	"os"
	"syscall"
)

// tryLock takes an flock on f without waiting (ErrBusy if a conflicting
// one is held). flock locks belong to the open file, so two opens in one
// process conflict as two processes do.
func tryLock(f *os.File, exclusive bool) error {
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return ErrBusy
	}
	return err
}

// waitLock takes an exclusive flock on f, waiting for it.
func waitLock(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

func unlock(f *os.File) { syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }

// ReleaseBeforeMove is false: a directory moves with files open in it.
const ReleaseBeforeMove = false
