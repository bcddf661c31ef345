// Command clone measures a full clone of one repository (>= 20 MB) over
// packwire's three transports against `git clone --no-local file://` and
// git daemon, all in the same run, rounds interleaved in a fresh random
// order each time, and prints medians, spread, ratios and server CPU.
//
//	go run ./bench/clone -rounds 7 -out bench/out/clone
package main

import (
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type target struct {
	name   string
	url    string
	env    []string  // extra client environment
	server *cpuMeter // the server's CPU; nil: not a server
}

type sample struct{ wall, serverCPU time.Duration }

func main() {
	rounds := flag.Int("rounds", 7, "clones per target")
	outDir := flag.String("out", "bench/out/clone", "work directory (repository, data, clones)")
	src := flag.String("src", runtime.GOROOT()+"/src", "source tree the benchmark history is made from")
	only := flag.String("only", "", "comma-separated substrings: run only targets whose name contains one")
	flag.Parse()
	log.SetFlags(0)
	must := func(err error) {
		if err != nil {
			log.Fatal(err)
		}
	}
	out, _ := filepath.Abs(*outDir)
	os.RemoveAll(out)
	must(os.MkdirAll(out, 0o755))

	home := filepath.Join(out, "home")
	os.MkdirAll(home, 0o700)
	clientEnv := []string{"HOME=" + home, "PATH=" + os.Getenv("PATH"), "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0", "LC_ALL=C"}

	bare := filepath.Join(out, "bench.git")
	log.Printf("building benchmark repository from %s ...", *src)
	must(buildRepo(*src, bare, 400))
	packSize := dirSize(filepath.Join(bare, "objects", "pack"))

	bin := filepath.Join(out, "packwire")
	run("go", "build", "-o", bin, "./cmd/packwire")
	data := filepath.Join(out, "data")
	run(bin, "repo", "import", "bench", bare, "--data", data, "--no-maintain") // measured as git gc packs it
	imported := filepath.Join(data, "repos", "bench.git")
	run("git", "-C", imported, "repack", "-adbq", "--write-bitmap-index")

	gitPort, httpPort, sshPort, daemonPort := freePort(), freePort(), freePort(), freePort()
	srv := exec.Command(bin, "serve", "--data", data, "--maintain-interval", "0",
		"--git", "127.0.0.1:"+gitPort, "--http", "127.0.0.1:"+httpPort, "--ssh", "127.0.0.1:"+sshPort, "--log-format", "json")
	srvLog, _ := os.Create(filepath.Join(out, "packwire.log"))
	srv.Stdout, srv.Stderr = srvLog, srvLog
	must(srv.Start())
	packwireCPU := newCPUMeter("packwire", srv.Process.Pid)

	// The peer: git daemon serving the same repository directory.
	daemon := exec.Command("git", "daemon", "--export-all", "--reuseaddr", "--base-path="+filepath.Join(data, "repos"),
		"--listen=127.0.0.1", "--port="+daemonPort, filepath.Join(data, "repos"))
	daemon.Env = clientEnv
	must(daemon.Start())
	daemonCPU := newCPUMeter("git-daemon", daemon.Process.Pid)
	defer func() {
		srv.Process.Signal(syscall.SIGTERM)
		daemon.Process.Kill()
		srv.Wait()
		daemon.Wait()
		packwireCPU.close()
		daemonCPU.close()
	}()
	for _, p := range []string{gitPort, httpPort, sshPort, daemonPort} {
		waitPort(p)
	}

	key := filepath.Join(home, "id_ed25519")
	run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key)
	sshBase := "ssh -F /dev/null -i " + key + " -o IdentitiesOnly=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o BatchMode=yes"

	targets := []target{
		{name: "file:// --no-local", url: "file://" + imported},
		{name: "git daemon (git://)", url: "git://127.0.0.1:" + daemonPort + "/bench.git", server: daemonCPU},
		{name: "packwire git://", url: "git://127.0.0.1:" + gitPort + "/bench", server: packwireCPU},
		{name: "packwire http://", url: "http://127.0.0.1:" + httpPort + "/bench.git", server: packwireCPU},
		{name: "packwire ssh (client default cipher)", url: "ssh://git@127.0.0.1:" + sshPort + "/bench.git", env: []string{"GIT_SSH_COMMAND=" + sshBase}, server: packwireCPU},
		{name: "packwire ssh (aes128-gcm)", url: "ssh://git@127.0.0.1:" + sshPort + "/bench.git", env: []string{"GIT_SSH_COMMAND=" + sshBase + " -c aes128-gcm@openssh.com"}, server: packwireCPU},
	}
	if *only != "" {
		var kept []target
		for _, t := range targets {
			for _, o := range strings.Split(*only, ",") {
				if strings.Contains(t.name, o) {
					kept = append(kept, t)
					break
				}
			}
		}
		targets = kept
	}
	results := map[string][]sample{}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	// One warm-up clone per target (page cache, first-start costs), not counted.
	for r := -1; r < *rounds; r++ {
		order := rng.Perm(len(targets))
		for _, i := range order {
			t := targets[i]
			dst := filepath.Join(out, "clone")
			os.RemoveAll(dst)
			cpu0 := t.server.read()
			start := time.Now()
			cmd := exec.Command("git", "clone", "-q", "--no-local", t.url, dst)
			cmd.Env = append(append([]string{}, clientEnv...), t.env...)
			if b, err := cmd.CombinedOutput(); err != nil {
				log.Fatalf("%s: %v\n%s", t.name, err, b)
			}
			wall := time.Since(start)
			// The server's accounting of a finished request can trail the
			// client's exit by a moment: let the git child be reaped.
			time.Sleep(100 * time.Millisecond)
			cpu := t.server.read() - cpu0
			if r >= 0 {
				results[t.name] = append(results[t.name], sample{wall, cpu})
			}
			fmt.Fprintf(os.Stderr, "\rround %d/%d %-40s %6.2fs", r+1, *rounds, t.name, wall.Seconds())
		}
	}
	fmt.Fprintln(os.Stderr)

	gitVersion := strings.TrimSpace(output("git", "--version"))
	sshVersion := strings.TrimSpace(output("ssh", "-V"))
	fmt.Printf("Full clone, %s repository (%d objects, pack %.1f MiB), %d rounds after 1 warm-up, order shuffled each round.\n",
		"Go-source-shaped", countObjects(imported), float64(packSize)/(1<<20), *rounds)
	fmt.Printf("%s, %s, %d CPUs, %s, %s\n\n", gitVersion, sshVersion, runtime.NumCPU(), runtime.Version(), time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Printf("Server CPU from %s.\n\n", packwireCPU.source())
	fmt.Println("| target | median wall | min - max | wall / first row | server CPU (median) |")
	fmt.Println("|---|---:|---:|---:|---:|")
	base := median(results[targets[0].name], func(s sample) time.Duration { return s.wall })
	for _, t := range targets {
		s := results[t.name]
		m := median(s, func(s sample) time.Duration { return s.wall })
		lo, hi := s[0].wall, s[0].wall
		for _, x := range s {
			lo, hi = min(lo, x.wall), max(hi, x.wall)
		}
		cpu := "-"
		if t.server != nil {
			cpu = fmt.Sprintf("%.2f s", median(s, func(s sample) time.Duration { return s.serverCPU }).Seconds())
		}
		fmt.Printf("| %s | %.2f s | %.2f - %.2f s | %.3fx | %s |\n", t.name, m.Seconds(), lo.Seconds(), hi.Seconds(), m.Seconds()/base.Seconds(), cpu)
	}
}

func median(s []sample, f func(sample) time.Duration) time.Duration {
	v := make([]time.Duration, len(s))
	for i, x := range s {
		v[i] = f(x)
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// cpuMeter reads the CPU a server and everything it starts used: from a
// cgroup v1 cpuacct group when this process may make one (root), since
// some servers reap their children late or never; else from /proc
// (the process and the children it has reaped).
type cpuMeter struct {
	pid    int
	cgroup string
}

func newCPUMeter(name string, pid int) *cpuMeter {
	m := &cpuMeter{pid: pid}
	dir := fmt.Sprintf("/sys/fs/cgroup/cpuacct/packwire-bench-%d/%s", os.Getpid(), name)
	if os.MkdirAll(dir, 0o755) == nil && os.WriteFile(dir+"/cgroup.procs", []byte(strconv.Itoa(pid)), 0o644) == nil {
		m.cgroup = dir
	}
	return m
}

func (m *cpuMeter) source() string {
	if m.cgroup != "" {
		return "a cgroup v1 cpuacct group per server (all its processes)"
	}
	return "/proc/PID/stat utime+stime+cutime+cstime (children only once reaped)"
}

func (m *cpuMeter) read() time.Duration {
	if m == nil {
		return 0
	}
	if m.cgroup != "" {
		b, err := os.ReadFile(m.cgroup + "/cpuacct.usage")
		if err == nil {
			ns, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			return time.Duration(ns)
		}
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", m.pid))
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

// close kills whatever is left in the cgroup (git daemon's wrapper leaves
// the real daemon behind) and removes it.
func (m *cpuMeter) close() {
	if m.cgroup == "" {
		return
	}
	for i := 0; i < 50; i++ {
		procs, _ := os.ReadFile(m.cgroup + "/cgroup.procs")
		for _, p := range strings.Fields(string(procs)) {
			if pid, err := strconv.Atoi(p); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if os.Remove(m.cgroup) == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	os.Remove(filepath.Dir(m.cgroup))
}

func run(name string, args ...string) {
	if b, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		log.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, b)
	}
}

func output(name string, args ...string) string {
	b, _ := exec.Command(name, args...).CombinedOutput()
	return string(b)
}

func countObjects(repo string) int {
	m := regexp.MustCompile(`in-pack: (\d+)`).FindStringSubmatch(output("git", "-C", repo, "count-objects", "-v"))
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

func dirSize(dir string) int64 {
	var total int64
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if info, err := e.Info(); err == nil {
			total += info.Size()
		}
	}
	return total
}

func freePort() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

func waitPort(port string) {
	for i := 0; i < 100; i++ {
		if c, err := net.Dial("tcp", "127.0.0.1:"+port); err == nil {
			c.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	log.Fatalf("nothing listens on port %s", port)
}
