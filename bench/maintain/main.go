// Command maintain measures what packwire's maintenance layout does for
// clone serving. On a Go-source-shaped repository with a few thousand
// unfetched refs (refs/pull/N/head on side commits), it clones full,
// shallow (--depth=1), treeless (--filter=tree:0) and blobless
// (--filter=blob:none) over smart HTTP from
//
//   - nginx + fcgiwrap + git-http-backend serving the `git gc`-shaped copy,
//   - packwire serving the same `git gc`-shaped copy ("before"),
//   - packwire serving a copy after `packwire maintain` ("after"),
//
// in one run, rounds interleaved in a fresh random order, and prints
// medians of client wall time and server CPU (each server in its own
// cgroup v1 cpuacct group: fcgiwrap never waits for its children). It then
// sweeps the drift (objects of the default clone outside the preferred
// pack) to show where a full rebuild pays off, which is the rule
// `packwire maintain --drift` uses.
//
// Needs root (cgroups), git, nginx and fcgiwrap (installed with apt-get if
// missing).
//
//	go run ./bench/maintain -rounds 5 -out /tmp/bench-maintain
package main

import (
	"bytes"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"packwire/bench/internal/benchkit"
)

type kind struct {
	name string
	args []string
}

var kinds = []kind{
	{"full", nil},
	{"shallow (--depth=1)", []string{"--depth=1"}},
	{"treeless (--filter=tree:0)", []string{"--filter=tree:0"}},
	{"blobless (--filter=blob:none)", []string{"--filter=blob:none"}},
}

type target struct {
	name   string
	url    string
	server *cpuMeter
}

type sample struct{ wall, cpu time.Duration }

// cleanups run before a fatal exit too, so no server outlives the run.
var cleanups []func()

func fatalf(format string, args ...any) {
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	log.Fatalf(format, args...)
}

var clientEnv []string

func main() {
	rounds := flag.Int("rounds", 5, "clones per target and kind")
	outDir := flag.String("out", "/tmp/bench-maintain", "work directory")
	src := flag.String("src", runtime.GOROOT()+"/src", "source tree the history is made from")
	pulls := flag.Int("pulls", 3000, "refs/pull/N/head refs on side commits")
	sweep := flag.Bool("sweep", true, "also measure clone CPU against drift")
	flag.Parse()
	log.SetFlags(0)
	if os.Geteuid() != 0 {
		log.Fatal("run as root: each server is measured in its own cgroup")
	}
	ensureTools()
	out, _ := filepath.Abs(*outDir)
	os.RemoveAll(out)
	must(os.MkdirAll(out, 0o755))
	home := filepath.Join(out, "home")
	os.MkdirAll(home, 0o700)
	clientEnv = []string{"HOME=" + home, "PATH=" + os.Getenv("PATH"), "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0", "LC_ALL=C"}

	// The repository, `git gc`-shaped: one pack with a bitmap, packed refs.
	gcShaped := filepath.Join(out, "gc-shaped.git")
	log.Printf("building the repository from %s with %d unfetched refs ...", *src, *pulls)
	must(benchkit.BuildRepo(*src, gcShaped, 400))
	must(addPullRefs(gcShaped, *pulls))
	run("git", "-C", gcShaped, "config", "uploadpack.allowFilter", "true")
	run("git", "-C", gcShaped, "gc", "--quiet", "--prune=now")

	bin := filepath.Join(out, "packwire")
	run("go", "build", "-o", bin, "./cmd/packwire")
	data := filepath.Join(out, "data")
	must(os.MkdirAll(filepath.Join(data, "repos"), 0o755))
	run("cp", "-a", gcShaped, filepath.Join(data, "repos", "before.git"))
	run("cp", "-a", gcShaped, filepath.Join(data, "repos", "after.git"))
	run("cp", "-a", gcShaped, filepath.Join(data, "repos", "drift.git"))
	maintainOut := output(bin, "maintain", "--data", data, "after", "drift")
	log.Print(strings.TrimSpace(maintainOut))
	peerRoot := filepath.Join(out, "peer")
	must(os.MkdirAll(peerRoot, 0o755))
	run("cp", "-a", gcShaped, filepath.Join(peerRoot, "bench.git"))

	// packwire, maintenance scheduler off so that the layouts stay put.
	port := freePort()
	pwCPU := newCPUMeter("packwire")
	srv := pwCPU.command(bin, "serve", "--data", data, "--git", "", "--ssh", "", "--http", "127.0.0.1:"+port, "--maintain-interval", "0", "--log-format", "json")
	srvLog, _ := os.Create(filepath.Join(out, "packwire.log"))
	srv.Stdout, srv.Stderr = srvLog, srvLog
	must(srv.Start())

	// nginx + fcgiwrap + git-http-backend, both in one cgroup.
	peerPort := freePort()
	peerCPU := newCPUMeter("nginx-fcgiwrap")
	nginx, fcgi := startPeer(out, peerRoot, peerPort, peerCPU)
	stopServers := func() {
		srv.Process.Signal(syscall.SIGTERM)
		srv.Wait()
		nginx.Process.Signal(syscall.SIGQUIT)
		fcgi.Process.Kill()
		nginx.Wait()
		fcgi.Wait()
		pwCPU.close()
		peerCPU.close()
	}
	cleanups = append(cleanups, stopServers)
	defer stopServers()
	waitPort(port)
	waitPort(peerPort)

	targets := []target{
		{"nginx + git-http-backend, git gc layout", "http://127.0.0.1:" + peerPort + "/bench.git", peerCPU},
		{"packwire, git gc layout (before)", "http://127.0.0.1:" + port + "/before.git", pwCPU},
		{"packwire, maintained (after)", "http://127.0.0.1:" + port + "/after.git", pwCPU},
	}
	results := map[string][]sample{}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	for r := -1; r < *rounds; r++ {
		type job struct {
			t target
			k kind
		}
		var jobs []job
		for _, t := range targets {
			for _, k := range kinds {
				jobs = append(jobs, job{t, k})
			}
		}
		rng.Shuffle(len(jobs), func(i, j int) { jobs[i], jobs[j] = jobs[j], jobs[i] })
		for _, j := range jobs {
			s := clone(out, j.t, j.k)
			if r >= 0 {
				results[j.t.name+"|"+j.k.name] = append(results[j.t.name+"|"+j.k.name], s)
			}
			fmt.Fprintf(os.Stderr, "\rround %d/%d %-45s %-30s %6.2fs", r+1, *rounds, j.t.name, j.k.name, s.wall.Seconds())
		}
	}
	fmt.Fprintln(os.Stderr)

	fmt.Printf("Go-source-shaped repository: %d objects reachable from branches and tags, %d refs (%d refs/pull/*), gc-shaped pack %.1f MiB.\n",
		countObjects(gcShaped, "--branches", "--tags"), refCount(gcShaped), *pulls, float64(dirSize(filepath.Join(gcShaped, "objects", "pack")))/(1<<20))
	fmt.Printf("%s, %s, %d CPUs, %s, %s. %d rounds after 1 warm-up, order shuffled each round; medians.\n",
		strings.TrimSpace(output("git", "--version")), strings.TrimSpace(firstLine(output("nginx", "-v"))), runtime.NumCPU(), runtime.Version(),
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), *rounds)
	fmt.Printf("Server CPU: cgroup v1 cpuacct, one group per server (packwire; nginx + fcgiwrap + git-http-backend).\n")
	fmt.Printf("Maintenance of the copy: %s\n\n", strings.TrimSpace(maintainOut))
	fmt.Println("| clone | server | wall | server CPU | wall vs nginx | CPU vs nginx |")
	fmt.Println("|---|---|---:|---:|---:|---:|")
	for _, k := range kinds {
		peer := results[targets[0].name+"|"+k.name]
		pw, pc := median(peer, wallOf), median(peer, cpuOf)
		for _, t := range targets {
			s := results[t.name+"|"+k.name]
			w, c := median(s, wallOf), median(s, cpuOf)
			fmt.Printf("| %s | %s | %.2f s | %.3f s | %.2fx | %.3fx |\n", k.name, t.name, w.Seconds(), c.Seconds(), w.Seconds()/pw.Seconds(), c.Seconds()/pc.Seconds())
		}
	}
	if *sweep {
		driftSweep(out, bin, data, port, pwCPU, *rounds)
	}
}

// driftSweep measures full clone server CPU against drift in drift.git:
// first new history (pushed as packs, folded geometrically, the preferred
// pack not rebuilt), then history removed from branches after a rebuild
// (objects of the preferred pack no clone wants any more).
func driftSweep(out, bin, data, port string, cpu *cpuMeter, rounds int) {
	dir := filepath.Join(data, "repos", "drift.git")
	t := target{"drift", "http://127.0.0.1:" + port + "/drift.git", cpu}
	var base time.Duration
	measure := func(label string) {
		drift := driftOf(output(bin, "repo", "show", "drift", "--data", data))
		clone(out, t, kinds[0]) // warm-up
		var s []sample
		for i := 0; i < rounds; i++ {
			s = append(s, clone(out, t, kinds[0]))
		}
		c := median(s, cpuOf)
		if base == 0 {
			base = c
		}
		fmt.Printf("| %s | %s | %.3f s | %.2f s | %.2fx |\n", label, drift, c.Seconds(), median(s, wallOf).Seconds(), c.Seconds()/base.Seconds())
	}
	fmt.Println("\nFull clone server CPU against drift, packwire, drift.git (a copy of the repository above):")
	fmt.Println()
	fmt.Println("| history | drift | full clone server CPU | wall | CPU vs drift 0 |")
	fmt.Println("|---|---:|---:|---:|---:|")
	added := 0
	for _, step := range []int{0, 60, 150, 300, 600, 1200} {
		if step > added {
			must(appendCommits(dir, added, step-added))
			added = step
			// --drift 1: fold only, the way the scheduler does below the threshold.
			output(bin, "maintain", "--data", data, "--drift", "1", "drift")
		}
		measure(fmt.Sprintf("+%d commits, folded", step))
	}
	rebuild := strings.TrimSpace(output(bin, "maintain", "--data", data, "--full", "drift"))
	measure(fmt.Sprintf("+%d commits, full rebuild", added))
	tip := strings.TrimSpace(output("git", "-C", dir, "rev-parse", "main"))
	for _, back := range []int{300, 600, 1200} {
		run("git", "-C", dir, "update-ref", "refs/heads/main", fmt.Sprintf("%s~%d", tip, back))
		measure(fmt.Sprintf("main rewound by %d commits", back))
	}
	fmt.Printf("\nThe full rebuild at +%d commits: %s\n", added, rebuild)
}

func driftOf(show string) string {
	for _, line := range strings.Split(show, "\n") {
		if i := strings.Index(line, "unwanted: drift "); i >= 0 {
			return strings.Fields(line[i+16:])[0]
		}
	}
	return "?"
}

func clone(out string, t target, k kind) sample {
	dst := filepath.Join(out, "clone")
	os.RemoveAll(dst)
	cpu0 := t.server.read()
	start := time.Now()
	args := append([]string{"clone", "-q", "--no-local"}, k.args...)
	cmd := exec.Command("git", append(args, t.url, dst)...)
	cmd.Env = clientEnv
	if b, err := cmd.CombinedOutput(); err != nil {
		fatalf("%s %s: %v\n%s", t.name, k.name, err, b)
	}
	wall := time.Since(start)
	time.Sleep(150 * time.Millisecond) // let the server reap its git
	return sample{wall, t.server.read() - cpu0}
}

// addPullRefs makes n side commits on refs/pull/N/head, each off a commit
// of main and editing one file the way a pull request does (lines inserted
// into the current version): objects outside branches and tags that are
// close relatives of objects inside, so git gc's one pack deltifies across
// the two sets, as it does in real repositories.
func addPullRefs(bare string, n int) error {
	commits := strings.Fields(output("git", "-C", bare, "rev-list", "main"))
	files := strings.Fields(output("git", "-C", bare, "ls-tree", "-r", "--name-only", "main"))
	rng := rand.New(rand.NewPCG(5, 6))
	picked := make([]string, n)
	var req bytes.Buffer
	for i := range picked {
		picked[i] = files[rng.IntN(len(files))]
		fmt.Fprintf(&req, "main:%s\n", picked[i])
	}
	cat := exec.Command("git", "-C", bare, "cat-file", "--batch")
	cat.Stdin = &req
	raw, err := cat.Output()
	if err != nil {
		return err
	}
	var in bytes.Buffer
	for i := 1; i <= n; i++ {
		// "<oid> blob <size>\n<content>\n"
		nl := bytes.IndexByte(raw, '\n')
		size, _ := strconv.Atoi(string(bytes.Fields(raw[:nl])[2]))
		content := raw[nl+1 : nl+1+size]
		raw = raw[nl+1+size+1:]
		at := len(content) / 3
		if k := bytes.IndexByte(content[at:], '\n'); k >= 0 {
			at += k + 1
		}
		body := append(append(append([]byte{}, content[:at]...), strings.Repeat(fmt.Sprintf("// proposed change %d\n", i), 1+i%7)...), content[at:]...)
		fmt.Fprintf(&in, "commit refs/pull/%d/head\ncommitter Dev <dev@example.com> %d +0000\ndata 12\npull request\nfrom %s\n",
			i, 1700000000+i, commits[rng.IntN(len(commits))])
		fmt.Fprintf(&in, "M 100644 inline %s\ndata %d\n%s\n", picked[i-1], len(body), body)
	}
	cmd := exec.Command("git", "fast-import", "--quiet")
	cmd.Dir = bare
	cmd.Stdin = &in
	cmd.Stderr = os.Stderr
	return cmd.Run()
}

// appendCommits adds n commits on main, each editing three files, as one
// pack (what a push with receive.unpackLimit=1 leaves).
func appendCommits(bare string, from, n int) error {
	head := strings.TrimSpace(output("git", "-C", bare, "rev-parse", "main"))
	files := strings.Fields(output("git", "-C", bare, "ls-tree", "-r", "--name-only", "main"))
	rng := rand.New(rand.NewPCG(uint64(from), 9))
	var in bytes.Buffer
	for c := 0; c < n; c++ {
		fmt.Fprintf(&in, "commit refs/heads/main\ncommitter Dev <dev@example.com> %d +0000\ndata 5\nmore\n", 1800000000+from+c)
		if c == 0 {
			fmt.Fprintf(&in, "from %s\n", head)
		}
		for k := 0; k < 3; k++ {
			body := fmt.Sprintf("// new work %d.%d\n%s", from+c, k, strings.Repeat("// more lines of new code\n", 5+rng.IntN(20)))
			fmt.Fprintf(&in, "M 100644 inline %s\ndata %d\n%s\n", files[rng.IntN(len(files))], len(body), body)
		}
	}
	cmd := exec.Command("git", "-c", "fastimport.unpackLimit=1", "fast-import", "--quiet")
	cmd.Dir = bare
	cmd.Stdin = &in
	cmd.Stderr = os.Stderr
	return cmd.Run()
}

func startPeer(out, root, port string, m *cpuMeter) (*exec.Cmd, *exec.Cmd) {
	dir := filepath.Join(out, "nginx")
	must(os.MkdirAll(filepath.Join(dir, "tmp"), 0o755))
	sock := filepath.Join(dir, "fcgiwrap.sock")
	backend := strings.TrimSpace(output("git", "--exec-path")) + "/git-http-backend"
	// The worker runs as root like fcgiwrap, so it may use fcgiwrap's socket.
	conf := fmt.Sprintf(`user root;
worker_processes 1;
daemon off;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log;
events { worker_connections 256; }
http {
  access_log off;
  client_body_temp_path %[1]s/tmp/body;
  fastcgi_temp_path %[1]s/tmp/fastcgi;
  proxy_temp_path %[1]s/tmp/proxy;
  uwsgi_temp_path %[1]s/tmp/uwsgi;
  scgi_temp_path %[1]s/tmp/scgi;
  server {
    listen 127.0.0.1:%[2]s;
    location / {
      client_max_body_size 0;
      fastcgi_buffering off;
      fastcgi_pass unix:%[3]s;
      fastcgi_param SCRIPT_FILENAME %[4]s;
      fastcgi_param GIT_PROJECT_ROOT %[5]s;
      fastcgi_param GIT_HTTP_EXPORT_ALL "";
      fastcgi_param GIT_PROTOCOL $http_git_protocol;
      fastcgi_param PATH_INFO $uri;
      fastcgi_param QUERY_STRING $query_string;
      fastcgi_param REQUEST_METHOD $request_method;
      fastcgi_param CONTENT_TYPE $content_type;
      fastcgi_param CONTENT_LENGTH $content_length;
      fastcgi_param HTTP_CONTENT_ENCODING $http_content_encoding;
      fastcgi_param REMOTE_ADDR $remote_addr;
      fastcgi_param SERVER_PROTOCOL $server_protocol;
      fastcgi_param HOME %[1]s;
    }
  }
}
`, dir, port, sock, backend, root)
	must(os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(conf), 0o644))
	fcgi := m.command("fcgiwrap", "-s", "unix:"+sock, "-c", "4")
	fcgi.Stderr = os.Stderr
	must(fcgi.Start())
	for i := 0; i < 50; i++ {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	nginx := m.command("nginx", "-e", filepath.Join(dir, "error.log"), "-c", filepath.Join(dir, "nginx.conf"), "-p", dir)
	nginx.Stderr = os.Stderr
	must(nginx.Start())
	return nginx, fcgi
}

func ensureTools() {
	var missing []string
	for _, t := range []string{"nginx", "fcgiwrap"} {
		if _, err := exec.LookPath(t); err != nil {
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		log.Printf("installing %s with apt-get ...", strings.Join(missing, " "))
		run("apt-get", "update", "-qq")
		cmd := exec.Command("apt-get", append([]string{"install", "-y", "-qq"}, missing...)...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if b, err := cmd.CombinedOutput(); err != nil {
			log.Fatalf("apt-get install %s: %v\n%s", strings.Join(missing, " "), err, b)
		}
	}
	if _, err := os.Stat("/sys/fs/cgroup/cpuacct"); err != nil {
		log.Fatal("no cgroup v1 cpuacct hierarchy at /sys/fs/cgroup/cpuacct")
	}
}

func wallOf(s sample) time.Duration { return s.wall }
func cpuOf(s sample) time.Duration  { return s.cpu }

// median of one measure of the samples.
func median(s []sample, f func(sample) time.Duration) time.Duration {
	v := make([]time.Duration, len(s))
	for i, x := range s {
		v[i] = f(x)
	}
	return benchkit.Median(v)
}

// cpuMeter reads the CPU of every process in a cgroup v1 cpuacct group.
type cpuMeter struct{ cgroup string }

func newCPUMeter(name string) *cpuMeter {
	dir := fmt.Sprintf("/sys/fs/cgroup/cpuacct/packwire-bench-maintain-%d/%s", os.Getpid(), name)
	must(os.MkdirAll(dir, 0o755))
	return &cpuMeter{cgroup: dir}
}

// command starts a program inside the group from its first instruction, so
// that the children it forks at once (fcgiwrap's, nginx's worker) are in.
func (m *cpuMeter) command(name string, args ...string) *exec.Cmd {
	return exec.Command("sh", append([]string{"-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, m.cgroup, name}, args...)...)
}

func (m *cpuMeter) read() time.Duration {
	b, err := os.ReadFile(m.cgroup + "/cpuacct.usage")
	must(err)
	ns, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return time.Duration(ns)
}

func (m *cpuMeter) close() {
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

func must(err error) {
	if err != nil {
		fatalf("%v", err)
	}
}

func run(name string, args ...string) {
	if b, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, b)
	}
}

func output(name string, args ...string) string {
	b, _ := exec.Command(name, args...).CombinedOutput()
	return string(b)
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func countObjects(bare string, revs ...string) int {
	n, _ := strconv.Atoi(strings.TrimSpace(output("git", append([]string{"-C", bare, "rev-list", "--objects", "--count"}, revs...)...)))
	return n
}

func refCount(bare string) int {
	return len(strings.Split(strings.TrimSpace(output("git", "-C", bare, "for-each-ref", "--format=x")), "\n"))
}

func dirSize(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

func freePort() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(err)
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

func waitPort(p string) {
	for i := 0; i < 100; i++ {
		if c, err := net.Dial("tcp", "127.0.0.1:"+p); err == nil {
			c.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	fatalf("nothing listening on %s", p)
}
