// Package benchkit holds what the benchmarks under bench/ share: the
// deterministic benchmark repository, per-server cgroups (CPU and memory),
// and small process and statistics helpers.
package benchkit

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"packwire/internal/lab/compare"
)

const (
	cpuRoot = "/sys/fs/cgroup/cpuacct"
	memRoot = "/sys/fs/cgroup/memory"
)

// Group accounts a server and everything it starts: a cgroup v1 cpuacct
// group and, when available, a memory group of the same name, when this
// process may make them (root); else /proc of one process (the process and
// the children it has reaped).
type Group struct {
	Name   string
	pid    int
	cpu    string // cpuacct group directory, "" when none
	mem    string // memory group directory, "" when none
	parent string // per-benchmark-process directory name
}

// NewGroup makes the groups packwire-bench-PID/name under the cgroup v1
// cpuacct and memory hierarchies. Processes join with Add or by starting
// through Command.
func NewGroup(name string) *Group {
	g := &Group{Name: name, parent: fmt.Sprintf("packwire-bench-%d", os.Getpid())}
	if dir := filepath.Join(cpuRoot, g.parent, name); os.MkdirAll(dir, 0o755) == nil {
		g.cpu = dir
	}
	if dir := filepath.Join(memRoot, g.parent, name); os.MkdirAll(dir, 0o755) == nil {
		g.mem = dir
	}
	return g
}

// Add moves a process into the group.
func (g *Group) Add(pid int) {
	if g.pid == 0 {
		g.pid = pid
	}
	for _, d := range []*string{&g.cpu, &g.mem} {
		if *d != "" && os.WriteFile(*d+"/cgroup.procs", []byte(strconv.Itoa(pid)), 0o644) != nil {
			os.Remove(*d)
			*d = ""
		}
	}
}

// Command returns a command that joins the group before it executes, so
// that every process it forks (nginx workers, fcgiwrap children) is in the
// group from its first instruction.
func (g *Group) Command(name string, args ...string) *exec.Cmd {
	script := ""
	for _, d := range []string{g.cpu, g.mem} {
		if d != "" {
			script += "echo $$ > " + d + "/cgroup.procs && "
		}
	}
	return exec.Command("sh", append([]string{"-c", script + `exec "$0" "$@"`, name}, args...)...)
}

// Source says where the CPU figures come from.
func (g *Group) Source() string {
	if g.cpu != "" {
		return "a cgroup v1 cpuacct group per server (all its processes)"
	}
	return "/proc/PID/stat utime+stime+cutime+cstime (children only once reaped)"
}

// CPUDir is the group's cgroup v1 cpuacct directory, "" when there is none
// (for tools that read it themselves: packwire bench --server-cgroup).
func (g *Group) CPUDir() string { return g.cpu }

// HasMemory reports whether memory figures come from a memory group.
func (g *Group) HasMemory() bool { return g != nil && g.mem != "" }

// Read returns the CPU the group used so far.
func (g *Group) Read() time.Duration {
	if g == nil {
		return 0
	}
	if g.cpu != "" {
		b, err := os.ReadFile(g.cpu + "/cpuacct.usage")
		if err == nil {
			ns, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			return time.Duration(ns)
		}
	}
	if g.pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", g.pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	var ticks int64
	for _, i := range []int{11, 12, 13, 14} { // utime stime cutime cstime
		n, _ := strconv.ParseInt(f[i], 10, 64)
		ticks += n
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ
}

// ResetPeak sets the memory group's high-water mark to its current usage.
func (g *Group) ResetPeak() {
	if g.HasMemory() {
		os.WriteFile(g.mem+"/memory.max_usage_in_bytes", []byte("0"), 0o644)
	}
}

// Reclaim asks the kernel to drop the page cache charged to the memory
// group (cgroup v1 memory.force_empty), so that a peak measured next starts
// from the group's own live memory, not from files earlier runs left
// cached; the machine's other page cache is not touched.
func (g *Group) Reclaim() {
	if g.HasMemory() {
		os.WriteFile(g.mem+"/memory.force_empty", []byte("0"), 0o644)
	}
}

// Usage returns the memory charged to the group now (anonymous memory and
// page cache).
func (g *Group) Usage() int64 {
	if !g.HasMemory() {
		return 0
	}
	b, _ := os.ReadFile(g.mem + "/memory.usage_in_bytes")
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// Peak returns the memory group's high-water mark (anonymous memory and
// page cache charged to the group) since the last ResetPeak.
func (g *Group) Peak() int64 {
	if !g.HasMemory() {
		return 0
	}
	b, _ := os.ReadFile(g.mem + "/memory.max_usage_in_bytes")
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// RSS returns the anonymous memory of the group now (total_rss in
// memory.stat: heap and stacks, not page cache).
func (g *Group) RSS() int64 {
	if !g.HasMemory() {
		return 0
	}
	b, _ := os.ReadFile(g.mem + "/memory.stat")
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "total_rss "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// Procs lists the processes in the group.
func (g *Group) Procs() []int {
	dir := g.cpu
	if dir == "" {
		dir = g.mem
	}
	if dir == "" {
		return nil
	}
	b, _ := os.ReadFile(dir + "/cgroup.procs")
	var pids []int
	for _, p := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(p); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Close kills whatever is left in the group (git daemon's wrapper leaves
// the real daemon behind; fcgiwrap never reaps) and removes it.
func (g *Group) Close() {
	if g == nil {
		return
	}
	for _, d := range []string{g.cpu, g.mem} {
		if d == "" {
			continue
		}
		for i := 0; i < 50; i++ {
			procs, _ := os.ReadFile(d + "/cgroup.procs")
			for _, p := range strings.Fields(string(procs)) {
				if pid, err := strconv.Atoi(p); err == nil {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			if os.Remove(d) == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		os.Remove(filepath.Dir(d)) // fails while other groups remain; the last Close removes it
	}
}

// Run runs a command and exits on failure, with its output.
func Run(name string, args ...string) {
	if b, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, b)
	}
}

// Output runs a command and returns its combined output.
func Output(name string, args ...string) string {
	b, _ := exec.Command(name, args...).CombinedOutput()
	return string(b)
}

// CountObjects returns the number of packed objects of a repository.
func CountObjects(repo string) int {
	m := regexp.MustCompile(`in-pack: (\d+)`).FindStringSubmatch(Output("git", "-C", repo, "count-objects", "-v"))
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// DirSize is the total size of the regular files directly in dir.
func DirSize(dir string) int64 {
	var total int64
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if info, err := e.Info(); err == nil {
			total += info.Size()
		}
	}
	return total
}

// FreePort returns a loopback TCP port nothing listens on.
func FreePort() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		Fatalf("%v", err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// WaitPort waits until something listens on a loopback port.
func WaitPort(port string) {
	// Up to 30 s: a server starting on a loaded machine (other benchmarks
	// on the same 2 CPUs) took more than 5.
	for i := 0; i < 600; i++ {
		if c, err := net.Dial("tcp", "127.0.0.1:"+port); err == nil {
			c.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	Fatalf("nothing listens on port %s", port)
}

// Percentile returns the p-th percentile (0-100, nearest rank) of v.
func Percentile(v []time.Duration, p float64) time.Duration { return compare.Percentile(v, p) }

// Median returns the median of v.
func Median(v []time.Duration) time.Duration { return compare.Median(v) }
