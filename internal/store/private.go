package store

import (
	"errors"
	"io/fs"
	"os"
)

// privateMode is the mode of a SQLite database and its -wal and -shm
// files: the store holds webhook secrets and token hashes, and the request
// records who fetched what.
const privateMode = 0o600

// sqliteCompanions are the files SQLite keeps beside a database; it
// creates them with the database file's mode.
var sqliteCompanions = []string{"-wal", "-shm", "-journal"}

// makePrivate creates the database file at path as 0600 when it is
// missing, before SQLite creates it as 0644 under the usual umask, and
// takes group and other bits off it and its companions when they exist
// (made by an older packwire, or restored): whatever the umask, only the
// owner reads the store.
func makePrivate(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, privateMode)
	if err == nil {
		f.Close()
	} else if !errors.Is(err, fs.ErrExist) {
		return err
	}
	for _, suffix := range append([]string{""}, sqliteCompanions...) {
		if err := chmodPrivate(path + suffix); err != nil {
			return err
		}
	}
	return nil
}

// CreatePrivate creates an empty file at path (0600, whatever the umask)
// for SQLite to write a database into (VACUUM INTO takes an empty file).
func CreatePrivate(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, privateMode)
	if err != nil {
		return err
	}
	f.Close()
	return chmodPrivate(path)
}

// chmodPrivate sets a file's mode to 0600 if it is anything else; a
// missing file is fine.
func chmodPrivate(path string) error {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode().Perm() == privateMode {
		return nil
	}
	return os.Chmod(path, privateMode)
}
