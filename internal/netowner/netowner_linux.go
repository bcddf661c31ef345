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

// OwnerAmong is Owner looking only at roots and their descendants (the
// processes a test started, and what they run): reading every process's
// descriptors on a machine running thousands took seconds under load,
// longer than the timeouts under test. It returns the pid found, or 0.
func OwnerAmong(port int, roots []int) int {
	inode := socketInode(port)
	if inode == "" {
		return 0
	}
	want := "socket:[" + inode + "]"
	seen := map[int]bool{}
	queue := append([]int(nil), roots...)
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		if pid <= 1 || seen[pid] {
			continue
		}
		seen[pid] = true
		dir := fmt.Sprintf("/proc/%d", pid)
		if fds, err := os.ReadDir(filepath.Join(dir, "fd")); err == nil {
			for _, fd := range fds {
				if l, err := os.Readlink(filepath.Join(dir, "fd", fd.Name())); err == nil && l == want {
					return pid
				}
			}
		}
		tasks, _ := filepath.Glob(filepath.Join(dir, "task", "*", "children"))
		for _, t := range tasks {
			b, _ := os.ReadFile(t)
			for _, f := range strings.Fields(string(b)) {
				if child, err := strconv.Atoi(f); err == nil {
					queue = append(queue, child)
				}
			}
		}
	}
	return 0
}
