//go:build unix

package maintain

import (
	"errors"
	"os"
	"syscall"
)

// tryLock takes an exclusive flock on f without waiting (ErrBusy if another
// maintainer holds it); the kernel drops it when a killed holder exits.
func tryLock(f *os.File) error {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return ErrBusy
	}
	return err
}

// unlock releases tryLock's lock before the file is closed.
func unlock(f *os.File) {
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
}
