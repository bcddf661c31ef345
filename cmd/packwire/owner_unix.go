//go:build unix

package main

import (
	"fmt"
	"os"
	"os/user"
	"strconv"
	"syscall"
)

// checkOwner refuses to work as root in a data directory another user owns
// (the service user): what an admin command creates there, a repository or
// a store journal, would be root's, and the server could not write it.
func checkOwner(dir string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	st, err := os.Stat(dir)
	if err != nil {
		return nil // Open says what is missing
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok || sys.Uid == 0 {
		return nil
	}
	name := strconv.FormatUint(uint64(sys.Uid), 10)
	if u, err := user.LookupId(name); err == nil {
		name = u.Username
	}
	return fmt.Errorf("%s belongs to user %s: run admin commands as that user (sudo -u %s packwire ...); as root, what they create would be root's and the server could not write it", dir, name, name)
}
