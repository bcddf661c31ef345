// Package netowner tells which process opened a loopback TCP connection,
// from /proc: the tests' and the nemesis suite's proxies use it to cut
// one node off from another while the rest of their traffic flows (a
// partition), every node being a process on 127.0.0.1. Linux only.
package netowner

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Owner is the pid of the process holding the IPv4 loopback socket bound
// to local port port, or 0 if none is found (gone, or not ours to read).
// It walks /proc: call it once per connection.
func Owner(port int) int {
	inode := socketInode(port)
	if inode == "" {
		return 0
	}
	return socketOwner(inode)
}

// socketInode is the inode of the IPv4 loopback socket bound to port.
func socketInode(port int) string {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return ""
	}
	defer f.Close()
	local := fmt.Sprintf("0100007F:%04X", port)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 9 && fields[1] == local {
			return fields[9]
		}
	}
	return ""
}

// socketOwner is the pid with socket inode open, or 0.
func socketOwner(inode string) int {
	want := "socket:[" + inode + "]"
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, dir := range procs {
		fds, err := os.ReadDir(filepath.Join(dir, "fd"))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if l, err := os.Readlink(filepath.Join(dir, "fd", fd.Name())); err == nil && l == want {
				pid, _ := strconv.Atoi(filepath.Base(dir))
				return pid
			}
		}
	}
	return 0
}

// ParentPid is pid's parent, or 0.
func ParentPid(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name is in parentheses and may hold spaces: the ppid is
	// the second field after its closing one.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(fields[1])
	return ppid
}
