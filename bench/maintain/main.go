// Command maintain measures what packwire's maintenance layout does for
// clone serving. On a synth repository (jquery-shaped at scale 1 by
// default) with a few thousand unfetched refs (refs/pull/K/head on side
// commits, `synth --pull-refs`), it clones full, shallow (--depth=1),
// treeless (--filter=tree:0) and blobless (--filter=blob:none) over smart
// HTTP from
//
//   - nginx + fcgiwrap + git-http-backend serving the `git gc`-shaped copy,
//   - packwire serving the same `git gc`-shaped copy ("before"),
//   - packwire serving a copy after `packwire maintain` ("after"),
//
// in one run, rounds interleaved in a fresh random order, and prints
// medians of client wall time and server CPU (each server in its own
// cgroup v1 cpuacct group: fcgiwrap never waits for its children), the
// paired ratios against nginx with a 95% confidence interval, and how much
// of packwire's CPU is git's (from the governor's records) and how much its
// own. It then sweeps the drift (objects of the default clone outside the
// preferred pack) to show where a full rebuild pays off, which is the rule
// `packwire maintain --drift` uses.
//
// Needs root (cgroups), git, nginx and fcgiwrap (installed with apt-get if
// missing).
//
//	go run ./bench/maintain -rounds 5 -out /tmp/bench-maintain
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"packwire/bench/internal/benchkit"
	"packwire/internal/lab/compare"
	"packwire/internal/lab/synth"
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
	server *benchkit.Server // nil: no server (file://)
	repo   string           // packwire's name of the repository ("": not packwire, no governor records)
}

// sample is one clone: client wall time and CPU (git clone and the
// children it waited for: remote helper, index-pack, and over file://
// upload-pack too), the server's CPU (its whole cgroup), and for packwire
// the git CPU the governor recorded for it.
type sample struct {
	wall, client, cpu, gitCPU time.Duration
	start, end                time.Time
	repo                      string
}

var clientEnv []string

func main() {
	rounds := flag.Int("rounds", 5, "clones per target and kind, after one warm-up round")
	outDir := flag.String("out", "/tmp/bench-maintain", "work directory")
	shape := flag.String("shape", "jquery", "synth shape of the repository: "+strings.Join(synth.Shapes(), ", "))
	scale := flag.Float64("scale", 1, "synth scale of the repository")
	pulls := flag.Int("pulls", 5200, "refs/pull/K/head refs, pull requests on side branches (synth --pull-refs); the issue measured jquery with about 5,200")
	sweep := flag.Bool("sweep", true, "also measure clone CPU against drift")
	perfClones := flag.Int("perf", 0, "profile packwire and its git children with perf over this many full clones of the maintained copy (0: off)")
	flag.Parse()
	log.SetFlags(0)
	benchkit.StopOnSignal()
	if os.Geteuid() != 0 {
		log.Fatal("run as root: each server is measured in its own cgroup")
	}
	if _, err := os.Stat("/sys/fs/cgroup/cpuacct"); err != nil {
		log.Fatal("no cgroup v1 cpuacct hierarchy at /sys/fs/cgroup/cpuacct: fcgiwrap's children could not be measured")
	}
	benchkit.EnsureTools(map[string]string{"nginx": "nginx", "fcgiwrap": "fcgiwrap"})
	out, _ := filepath.Abs(*outDir)
	os.RemoveAll(out)
	must(os.MkdirAll(out, 0o755))
	home := filepath.Join(out, "home")
	os.MkdirAll(home, 0o700)
	clientEnv = []string{"HOME=" + home, "PATH=" + os.Getenv("PATH"), "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0", "LC_ALL=C"}
	// synth's git, ours and the servers': no system or global git config
	// (HOME stays: go build needs its caches).
	os.Setenv("GIT_CONFIG_NOSYSTEM", "1")
	os.Setenv("GIT_CONFIG_GLOBAL", "/dev/null")

	// The repository, `git gc`-shaped: one pack with a bitmap, packed refs.
	gcShaped := filepath.Join(out, "gc-shaped.git")
	log.Printf("making a %s-shaped repository at scale %g with %d pull refs ...", *shape, *scale, *pulls)
	made, err := synth.Generate(context.Background(), synth.Options{Shape: *shape, Scale: *scale, Out: gcShaped, Seed: 1, PullRefs: *pulls})
	must(err)
	benchkit.Run("git", "-C", gcShaped, "config", "uploadpack.allowFilter", "true")
	benchkit.Run("git", "-C", gcShaped, "gc", "--quiet", "--prune=now")

	bin := filepath.Join(out, "packwire")
	benchkit.Run("go", "build", "-o", bin, "./cmd/packwire")
	data := filepath.Join(out, "data")
	must(os.MkdirAll(filepath.Join(data, "repos"), 0o755))
	for _, name := range []string{"before", "after", "drift"} {
		benchkit.Run("cp", "-a", gcShaped, filepath.Join(data, "repos", name+".git"))
	}
	maintainOut := strings.TrimSpace(benchkit.Output(bin, "maintain", "--data", data, "after", "drift"))
	log.Print(maintainOut)
	peerRoot := filepath.Join(out, "peer")
	must(os.MkdirAll(peerRoot, 0o755))
	benchkit.Run("cp", "-a", gcShaped, filepath.Join(peerRoot, "bench.git"))

	// packwire, maintenance scheduler off so that the layouts stay put and
	// fetch cache off so that every clone generates its pack (a replay
	// would measure the cache, not the layout); nginx + fcgiwrap +
	// git-http-backend, all in one group.
	port := benchkit.FreePort()
	pw := benchkit.StartPackwire("packwire", bin, data, filepath.Join(out, "packwire.log"), port,
		"--git", "", "--ssh", "", "--http", "127.0.0.1:"+port, "--maintain-interval", "0", "--fetch-cache=false")
	defer pw.Stop()
	peer := benchkit.StartNginx("nginx-fcgiwrap", filepath.Join(out, "nginx"), peerRoot)
	defer peer.Stop()

	targets := []target{
		{"nginx + git-http-backend, git gc layout", "http://127.0.0.1:" + peer.Port + "/bench.git", peer, ""},
		{"packwire, git gc layout (before)", "http://127.0.0.1:" + port + "/before.git", pw, "before"},
		{"packwire, maintained (after)", "http://127.0.0.1:" + port + "/after.git", pw, "after"},
		// The floor for any server on the maintained layout: no network,
		// the client's own upload-pack.
		{"no server: git clone file://, maintained", "file://" + filepath.Join(data, "repos", "after.git"), nil, ""},
	}
	results := map[string][]sample{}
	load := [][3]float64{loadAverage()}
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
		load = append(load, loadAverage())
	}
	fmt.Fprintln(os.Stderr)
	addGitCPU(bin, data, results)

	pack := filepath.Join(gcShaped, "objects", "pack")
	fmt.Printf("%s-shaped synth repository at scale %g (seed 1): %d commits, %d trees, %d blobs stored; %d objects reachable from branches and tags; %d refs (%d refs/pull/*); gc-shaped pack %.1f MiB.\n",
		*shape, *scale, made.Commits, made.Trees, made.Blobs, countObjects(gcShaped, "--branches", "--tags"), refCount(gcShaped), made.PullRefs, float64(benchkit.DirSize(pack))/(1<<20))
	fmt.Printf("%s, %s, %d CPUs, %s, %s. %d rounds after 1 warm-up, order shuffled each round; medians.\n",
		strings.TrimSpace(benchkit.Output("git", "--version")), strings.TrimSpace(firstLine(benchkit.Output("nginx", "-v"))), runtime.NumCPU(), runtime.Version(),
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), *rounds)
	fmt.Printf("Load average (1 min) during the rounds: %s.\n", loadRange(load))
	fmt.Printf("Server CPU: %s (packwire; nginx + fcgiwrap + git-http-backend). git CPU: the governor's record of each request of the clone.\n", pw.Group.Source())
	fmt.Printf("Maintenance of the copy: %s\n\n", maintainOut)
	fmt.Println("| clone | server | wall | client CPU | server CPU | of which git | wall vs nginx (95% CI) | CPU vs nginx (95% CI) |")
	fmt.Println("|---|---|---:|---:|---:|---:|---:|---:|")
	for _, k := range kinds {
		base := results[targets[0].name+"|"+k.name]
		for _, t := range targets {
			s := results[t.name+"|"+k.name]
			server, git := "-", "-"
			if t.server != nil {
				server = fmt.Sprintf("%.3f s", median(s, cpuOf).Seconds())
			}
			if t.repo != "" {
				git = fmt.Sprintf("%.3f s", median(s, gitCPUOf).Seconds())
			}
			wallRatio, cpuRatio := "1", "1"
			if t != targets[0] {
				wallRatio, cpuRatio = paired(base, s, wallOf), "-"
				if t.server != nil {
					cpuRatio = paired(base, s, cpuOf)
				}
			}
			fmt.Printf("| %s | %s | %.2f s | %.2f s | %s | %s | %s | %s |\n", k.name, t.name, median(s, wallOf).Seconds(), median(s, clientOf).Seconds(),
				server, git, wallRatio, cpuRatio)
		}
	}
	if *perfClones > 0 {
		profile(out, targets[2], *perfClones)
	}
	if *sweep {
		driftSweep(out, bin, data, targets[2], *rounds)
	}
}

// paired is the median of per-round ratios s/base with its 95% CI.
func paired(base, s []sample, f func(sample) time.Duration) string {
	res := compare.Analyze(durations(base, f), durations(s, f))
	if res.Pairs == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3fx (%.3f-%.3f)", res.MedianRatio, res.CILow, res.CIHigh)
}

// addGitCPU gives each packwire clone the git CPU (user + system) of the
// governor records of its repository that started while it ran.
func addGitCPU(bin, data string, results map[string][]sample) {
	time.Sleep(time.Second) // the governor writes its records in batches every 500 ms
	recs, err := benchkit.GovernorRecords(bin, data, 100000)
	if err != nil {
		benchkit.Fatalf("%v", err)
	}
	if len(recs) == 0 {
		benchkit.Fatalf("no governor records in %s", data)
	}
	for _, samples := range results {
		for i := range samples {
			s := &samples[i]
			if s.repo == "" {
				continue
			}
			for _, r := range recs {
				if strings.TrimSuffix(r.Repo, ".git") == s.repo && !r.Start.Before(s.start) && r.Start.Before(s.end) {
					s.gitCPU += r.CPU()
				}
			}
		}
	}
}

// driftSweep measures full clone server CPU against drift in drift.git:
// first new history (pushed as packs, folded geometrically, the preferred
// pack not rebuilt), then history removed from branches after a rebuild
// (objects of the preferred pack no clone wants any more).
func driftSweep(out, bin, data string, after target, rounds int) {
	dir := filepath.Join(data, "repos", "drift.git")
	t := target{"drift", strings.Replace(after.url, "/after.git", "/drift.git", 1), after.server, "drift"}
	var base time.Duration
	measure := func(label string) {
		drift := driftOf(benchkit.Output(bin, "repo", "show", "drift", "--data", data))
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
			benchkit.Output(bin, "maintain", "--data", data, "--drift", "1", "drift")
		}
		measure(fmt.Sprintf("+%d commits, folded", step))
	}
	rebuild := strings.TrimSpace(benchkit.Output(bin, "maintain", "--data", data, "--full", "drift"))
	measure(fmt.Sprintf("+%d commits, full rebuild", added))
	tip := strings.TrimSpace(benchkit.Output("git", "-C", dir, "rev-parse", "main"))
	for _, back := range []int{300, 600, 1200} {
		benchkit.Run("git", "-C", dir, "update-ref", "refs/heads/main", fmt.Sprintf("%s~%d", tip, back))
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
	var cpu0 time.Duration
	if t.server != nil {
		cpu0 = t.server.Group.Read()
	}
	start := time.Now()
	args := append([]string{"clone", "-q", "--no-local"}, k.args...)
	cmd := exec.Command("git", append(args, t.url, dst)...)
	cmd.Env = clientEnv
	if b, err := cmd.CombinedOutput(); err != nil {
		benchkit.Fatalf("%s %s: %v\n%s", t.name, k.name, err, b)
	}
	end := time.Now()
	s := sample{wall: end.Sub(start), client: cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), start: start, end: end, repo: t.repo}
	if t.server != nil {
		time.Sleep(150 * time.Millisecond) // let the server reap its git
		s.cpu = t.server.Group.Read() - cpu0
	}
	return s
}

// appendCommits adds n commits on main, each editing three files, as one
// pack (what a push with receive.unpackLimit=1 leaves).
func appendCommits(bare string, from, n int) error {
	head := strings.TrimSpace(benchkit.Output("git", "-C", bare, "rev-parse", "main"))
	files := strings.Fields(benchkit.Output("git", "-C", bare, "ls-tree", "-r", "--name-only", "main"))
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

func wallOf(s sample) time.Duration   { return s.wall }
func clientOf(s sample) time.Duration { return s.client }
func cpuOf(s sample) time.Duration    { return s.cpu }
func gitCPUOf(s sample) time.Duration { return s.gitCPU }

func durations(s []sample, f func(sample) time.Duration) []time.Duration {
	v := make([]time.Duration, len(s))
	for i, x := range s {
		v[i] = f(x)
	}
	return v
}

// median of one measure of the samples.
func median(s []sample, f func(sample) time.Duration) time.Duration {
	return benchkit.Median(durations(s, f))
}

// loadAverage is /proc/loadavg's 1, 5 and 15 minute figures.
func loadAverage() [3]float64 {
	var l [3]float64
	b, _ := os.ReadFile("/proc/loadavg")
	for i, f := range strings.Fields(string(b)) {
		if i < 3 {
			l[i], _ = strconv.ParseFloat(f, 64)
		}
	}
	return l
}

func loadRange(l [][3]float64) string {
	lo, hi := l[0][0], l[0][0]
	for _, x := range l {
		lo, hi = min(lo, x[0]), max(hi, x[0])
	}
	return fmt.Sprintf("%.1f-%.1f", lo, hi)
}

func must(err error) {
	if err != nil {
		benchkit.Fatalf("%v", err)
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func countObjects(bare string, revs ...string) int {
	n, _ := strconv.Atoi(strings.TrimSpace(benchkit.Output("git", append([]string{"-C", bare, "rev-list", "--objects", "--count"}, revs...)...)))
	return n
}

func refCount(bare string) int {
	return len(strings.Split(strings.TrimSpace(benchkit.Output("git", "-C", bare, "for-each-ref", "--format=x")), "\n"))
}
