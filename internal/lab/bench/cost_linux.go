package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// NewCgroupReader reads a cgroup's CPU usage: cgroup v2 cpu.stat
// (usage_usec) or v1 cpuacct.usage (nanoseconds). path is the cgroup's
// directory (or one of those two files).
func NewCgroupReader(path string) (CPUReader, error) {
	candidates := []string{path}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		candidates = []string{filepath.Join(path, "cpu.stat"), filepath.Join(path, "cpuacct.usage")}
	}
	for _, f := range candidates {
		r := cgroupReader{file: f}
		if _, err := r.CPU(); err == nil {
			return r, nil
		}
	}
	return nil, fmt.Errorf("%s: no cgroup v2 cpu.stat or v1 cpuacct.usage there (v1 groups live under /sys/fs/cgroup/cpuacct/)", path)
}

type cgroupReader struct{ file string }

func (r cgroupReader) String() string {
	if filepath.Base(r.file) == "cpuacct.usage" {
		return "cgroup v1 " + r.file
	}
	return "cgroup v2 " + r.file + " usage_usec"
}

func (r cgroupReader) CPU() (time.Duration, error) {
	b, err := os.ReadFile(r.file)
	if err != nil {
		return 0, err
	}
	if filepath.Base(r.file) == "cpuacct.usage" {
		return parseCPUAcctUsage(string(b))
	}
	return parseCPUStat(string(b))
}

// NewProcessTreeReader reads the CPU of a process and its descendants from
// /proc: utime+stime of each, plus cutime+cstime (children they reaped).
// Children that exit without being reaped by the tree (reparented to init)
// are missed: a cgroup is exact where the server's layout allows one.
func NewProcessTreeReader(pid int) (CPUReader, error) {
	r := procTreeReader{pid: pid}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d/stat", pid)); err != nil {
		return nil, fmt.Errorf("no process %d: %w", pid, err)
	}
	return r, nil
}

type procTreeReader struct{ pid int }

func (r procTreeReader) String() string {
	return fmt.Sprintf("process tree of PID %d from /proc (utime+stime+cutime+cstime; misses children nobody in the tree reaped)", r.pid)
}

func (r procTreeReader) CPU() (time.Duration, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	type proc struct {
		ppid  int
		ticks int64
	}
	procs := map[int]proc{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		st, err := parseProcStat(string(b))
		if err != nil {
			continue
		}
		procs[pid] = proc{ppid: st.PPID, ticks: st.UTime + st.STime + st.CUTime + st.CSTime}
	}
	if _, ok := procs[r.pid]; !ok {
		return 0, fmt.Errorf("process %d is gone", r.pid)
	}
	children := map[int][]int{}
	for pid, p := range procs {
		children[p.ppid] = append(children[p.ppid], pid)
	}
	var ticks int64
	stack := []int{r.pid}
	for len(stack) > 0 {
		pid := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		ticks += procs[pid].ticks
		stack = append(stack, children[pid]...)
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// userHZ is the unit of /proc/PID/stat times (USER_HZ, 100 on Linux).
const userHZ = 100
