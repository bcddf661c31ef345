// Command herd measures clone storms: N concurrent full clones of a fresh
// commit (nobody has its pack cached) against packwire with its fetch
// cache (one git per herd, responses replayed), packwire with the older
// pack cache (shared pack-objects runs through upload-pack's hook),
// packwire with neither, and nginx + fcgiwrap + git-http-backend, all
// serving the same bare repository over HTTP on loopback at once. Each
// server runs in its own cgroup v1 cpuacct and memory groups; the benchmark
// reports server CPU, CPU per clone, herd CPU against a 1-clone herd, wall
// percentiles and peak server memory, then compares repeated full clones
// served from packwire's caches with git-http-backend, and what storing a
// response costs a single clone (fetch cache on against off, in pairs).
//
//	go run ./bench/herd -rounds 3 -sizes 1,4,16,32 -out bench/out/herd
//
// Run as root: it makes cgroups and installs nginx and fcgiwrap if missing.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"packwire/bench/internal/benchkit"
	"packwire/internal/repostate"
)

type server struct {
	name  string
	short string
	url   string
	group *benchkit.Group
	data  string // packwire data directory; "" for nginx
	stop  func()
}

type herdResult struct {
	walls   []time.Duration
	errs    int
	errMsg  string
	cpu     time.Duration
	peak    int64 // memory.max_usage_in_bytes (anon + page cache charged)
	rssPeak int64 // sampled peak of total_rss (anonymous memory)
	cache   map[string]int
	gitCPU  time.Duration // packwire: git CPU of the herd's fetches, from the governor
	client  time.Duration // CPU of the clone processes and their children
}

var (
	out       string
	clientEnv []string
	work      string
	bare      string
	commitSeq int
)

func main() {
	rounds := flag.Int("rounds", 3, "rounds; each runs every herd size against every server, servers in a fresh random order")
	sizesFlag := flag.String("sizes", "1,4,16,32", "herd sizes (concurrent clones), comma-separated")
	outDir := flag.String("out", "bench/out/herd", "work directory (repository, data dirs, clones)")
	src := flag.String("src", runtime.GOROOT()+"/src", "source tree the benchmark history is made from")
	noBitmap := flag.Bool("no-bitmap", false, "delete the reachability bitmap after building the repository, so every pack is counted and compressed the slow way")
	hits := flag.Int("hits", 5, "repeated full clones per server in the cache-hit comparison")
	pairs := flag.Int("pairs", 10, "paired single clones of a fresh commit, fetch cache on against off (the cost of storing a response)")
	flag.Parse()
	log.SetFlags(0)
	benchkit.StopOnSignal()
	var sizes []int
	for _, f := range strings.Split(*sizesFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			log.Fatalf("bad -sizes %q", *sizesFlag)
		}
		sizes = append(sizes, n)
	}
	if os.Geteuid() != 0 {
		log.Fatal("herd needs root: it makes cgroup v1 cpuacct and memory groups per server (and may install nginx, fcgiwrap)")
	}
	for _, d := range []string{"/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup/memory"} {
		if _, err := os.Stat(d + "/cgroup.procs"); err != nil {
			log.Fatalf("herd needs the cgroup v1 hierarchy %s mounted (and writable)", d)
		}
	}
	benchkit.EnsureTools(map[string]string{"nginx": "nginx", "fcgiwrap": "fcgiwrap"})

	out, _ = filepath.Abs(*outDir)
	os.RemoveAll(out)
	must(os.MkdirAll(out, 0o755))
	home := filepath.Join(out, "home")
	must(os.MkdirAll(home, 0o700))
	clientEnv = []string{"HOME=" + home, "PATH=" + os.Getenv("PATH"), "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0", "LC_ALL=C"}

	repos := filepath.Join(out, "repos")
	bare = filepath.Join(repos, "bench.git")
	log.Printf("building benchmark repository from %s ...", *src)
	must(os.MkdirAll(repos, 0o755))
	must(benchkit.BuildRepo(*src, bare, 400))
	if *noBitmap {
		bitmaps, _ := filepath.Glob(filepath.Join(bare, "objects", "pack", "*.bitmap"))
		for _, f := range bitmaps {
			must(os.Remove(f))
		}
	}
	packSize := benchkit.DirSize(filepath.Join(bare, "objects", "pack"))
	objects := benchkit.CountObjects(bare)
	git(bare, "symbolic-ref", "HEAD", "refs/heads/main")
	// The work clone has an index but no checked-out files: newCommit only
	// adds one file, and a Go source tree under the module would be picked
	// up by go vet/test ./... ("_" makes the go tool skip the directory too).
	work = filepath.Join(out, "_work")
	git("", "clone", "-q", "--no-checkout", "-b", "main", bare, work)
	git(work, "reset", "-q")

	bin := filepath.Join(out, "packwire")
	benchkit.Run("go", "build", "-o", bin, "./cmd/packwire")

	var servers []*server
	defer func() {
		for _, s := range servers {
			s.stop()
		}
	}()
	servers = append(servers, startPackwire(bin, "packwire (fetch cache)", "a", repos, "--fetch-cache=true", "--pack-cache=false"))
	servers = append(servers, startPackwire(bin, "packwire (pack cache hook)", "b", repos, "--fetch-cache=false", "--pack-cache=true"))
	servers = append(servers, startPackwire(bin, "packwire (no sharing)", "c", repos, "--fetch-cache=false", "--pack-cache=false"))
	servers = append(servers, startNginx("nginx + fcgiwrap + git-http-backend", "d", repos))

	// Warm-up: one clone per server (page cache, first-start costs).
	for _, s := range servers {
		if r := runHerd(s, 1); r.errs > 0 {
			benchkit.Fatalf("warm-up clone from %s failed: %s", s.name, r.errMsg)
		}
		if s.data != "" {
			packCacheCounts(bin, s.data, 1) // marks the warm-up's records as seen
		}
	}

	results := map[string]map[int][]herdResult{}
	for _, s := range servers {
		results[s.name] = map[int][]herdResult{}
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	for r := 0; r < *rounds; r++ {
		for _, n := range sizes {
			for _, i := range rng.Perm(len(servers)) {
				s := servers[i]
				newCommit(fmt.Sprintf("round %d, %s, herd of %d", r, s.short, n))
				res := runHerd(s, n)
				if s.data != "" {
					res.cache, res.gitCPU = packCacheRecords(bin, s.data, n)
				}
				results[s.name][n] = append(results[s.name][n], res)
				log.Printf("round %d/%d  herd %2d  %-36s  cpu %6.2fs  p50 %5.2fs  errors %d  %v",
					r+1, *rounds, n, s.name, res.cpu.Seconds(), benchkit.Median(res.walls).Seconds(), res.errs, res.cache)
			}
		}
	}

	// Repeated full clone served from the cache: no new commit between
	// clones; the first clone of (a) after a fresh commit generates the
	// pack, the next ones are served from the cache.
	newCommit("cache-hit comparison")
	hitServers := []*server{servers[0], servers[1], servers[3]}
	firsts := map[*server]herdResult{}
	for _, s := range hitServers[:2] {
		first := runHerd(s, 1)
		first.cache = packCacheCounts(bin, s.data, 1)
		firsts[s] = first
	}
	hitCPU := map[*server][]time.Duration{}
	hitGit := map[*server][]time.Duration{}
	hitRSS := map[*server][]time.Duration{}
	hitCache := map[*server]map[string]int{}
	for i := 0; i < *hits; i++ {
		for _, j := range rng.Perm(len(hitServers)) {
			s := hitServers[j]
			res := runHerd(s, 1)
			if res.errs > 0 {
				benchkit.Fatalf("repeated clone from %s failed: %s", s.name, res.errMsg)
			}
			hitCPU[s] = append(hitCPU[s], res.cpu)
			hitRSS[s] = append(hitRSS[s], time.Duration(res.rssPeak))
			if s.data != "" {
				counts, gitCPU := packCacheRecords(bin, s.data, 1)
				if hitCache[s] == nil {
					hitCache[s] = map[string]int{}
				}
				for k, v := range counts {
					hitCache[s][k] += v
				}
				hitGit[s] = append(hitGit[s], gitCPU)
			}
		}
	}

	// What storing a response costs: single clones of a fresh commit (so
	// the fetch cache runs git and writes the response to disk) against
	// the same with the cache off, in pairs of shuffled order.
	var teeOn, teeOff []time.Duration
	var teeRatios []float64
	on, off := servers[0], servers[2]
	for i := 0; i < *pairs; i++ {
		newCommit(fmt.Sprintf("tee pair %d", i))
		got := map[*server]time.Duration{}
		order := []*server{on, off}
		if rng.IntN(2) == 1 {
			order[0], order[1] = off, on
		}
		for _, s := range order {
			res := runHerd(s, 1)
			if res.errs > 0 {
				benchkit.Fatalf("paired clone from %s failed: %s", s.name, res.errMsg)
			}
			got[s] = res.cpu
		}
		counts := packCacheCounts(bin, on.data, 1)
		if counts["generated"] != 1 {
			log.Printf("pair %d: the fetch cache did not run git for a fresh commit: %v", i, counts)
		}
		teeOn, teeOff = append(teeOn, got[on]), append(teeOff, got[off])
		teeRatios = append(teeRatios, got[on].Seconds()/got[off].Seconds())
		log.Printf("pair %d/%d  cache on %.3fs  off %.3fs", i+1, *pairs, got[on].Seconds(), got[off].Seconds())
	}

	// Report.
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	gitVersion := strings.TrimSpace(benchkit.Output("git", "--version"))
	nginxVersion := strings.TrimSpace(strings.TrimPrefix(benchkit.Output("nginx", "-v"), "nginx version: "))
	p("Clone herds, Go-source-shaped repository (%d objects, pack %.1f MiB), %d rounds after 1 warm-up clone per server, server order shuffled per herd.\n",
		objects, float64(packSize)/(1<<20), *rounds)
	p("%s, %s, fcgiwrap -c 64, %d CPUs, %s, %s\n\n", gitVersion, nginxVersion, runtime.NumCPU(), runtime.Version(), time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	if *noBitmap {
		p("**Variant without a reachability bitmap** (`-no-bitmap`): pack-objects must walk the history to count objects. ")
	}
	p("Every herd asks for a commit made just before it (pushed straight into the bare repository), so no server has its pack cached. ")
	p("Clients: `git -c protocol.version=2 clone --no-local --no-checkout -q URL dir_i`, isolated HOME, GIT_CONFIG_NOSYSTEM=1 (no checkout: it is client-side work only, and with it a 32-clone herd is bound by writing 32 work trees on 2 cores). ")
	p("All packwire servers run with --max-pack-jobs 64 --max-pack-jobs-per-repo 64 (no queueing). ")
	p("Server CPU: cgroup v1 cpuacct delta over the herd (+300 ms for stragglers), all processes of the server; ")
	p("peak memory: memory.max_usage_in_bytes of the server's memory group (anonymous memory and page cache charged to it), reset before each herd; peak RSS: total_rss sampled every 20 ms; git CPU: user+system of the herd's upload-pack processes and their children (pack-objects, the pack-cache hook) as packwire's governor records them (0 for a replayed response: no git runs), the rest of packwire's server CPU is its own process (HTTP, relay, accounting, caches); client CPU: all clone processes of the herd, on the same 2 cores. ")
	p("Figures are medians over rounds; min-max of server CPU in brackets.\n\n")
	type key struct {
		s string
		n int
	}
	med := map[key]time.Duration{}
	medPeak := map[key]int64{}
	for _, s := range servers {
		for _, n := range sizes {
			var cpus []time.Duration
			var peaks []time.Duration
			for _, r := range results[s.name][n] {
				cpus = append(cpus, r.cpu)
				peaks = append(peaks, time.Duration(r.peak))
			}
			med[key{s.name, n}] = benchkit.Median(cpus)
			medPeak[key{s.name, n}] = int64(benchkit.Median(peaks))
		}
	}
	for _, n := range sizes {
		p("### Herd of %d\n\n", n)
		p("| server | clones | errors | wall p50 | wall p95 | server CPU (min-max) | CPU per clone | herd CPU / 1-clone CPU | git CPU (governor) | peak memory | peak RSS | client CPU | pack cache |\n")
		p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
		for _, s := range servers {
			rs := results[s.name][n]
			var walls, cpus, rss, gits, clients []time.Duration
			errs, clones := 0, 0
			cache := map[string]int{}
			for _, r := range rs {
				walls = append(walls, r.walls...)
				cpus = append(cpus, r.cpu)
				rss = append(rss, time.Duration(r.rssPeak))
				gits = append(gits, r.gitCPU)
				clients = append(clients, r.client)
				errs += r.errs
				clones += len(r.walls)
				for k, v := range r.cache {
					cache[k] += v
				}
			}
			cpu := med[key{s.name, n}]
			ratio := "-"
			if one, ok := med[key{s.name, 1}]; ok && one > 0 {
				ratio = fmt.Sprintf("%.2fx", cpu.Seconds()/one.Seconds())
			}
			lo, hi := benchkit.Percentile(cpus, 0), benchkit.Percentile(cpus, 100)
			gitCol := "-"
			if s.data != "" {
				gitCol = fmt.Sprintf("%.2f s", benchkit.Median(gits).Seconds())
			}
			p("| %s | %d | %d | %.2f s | %.2f s | %.2f s (%.2f-%.2f) | %.3f s | %s | %s | %s | %s | %.1f s | %s |\n",
				s.name, clones, errs, benchkit.Median(walls).Seconds(), benchkit.Percentile(walls, 95).Seconds(),
				cpu.Seconds(), lo.Seconds(), hi.Seconds(), cpu.Seconds()/float64(n), ratio, gitCol,
				mib(medPeak[key{s.name, n}]), mib(int64(benchkit.Median(rss))), benchkit.Median(clients).Seconds(), cacheString(cache, s.data != ""))
		}
		p("\n")
		for _, s := range servers {
			for _, r := range results[s.name][n] {
				if r.errMsg != "" {
					p("First error from %s (herd of %d): `%s`\n\n", s.name, n, r.errMsg)
					break
				}
			}
		}
	}
	a, peer := servers[0], servers[3]
	mA, mC := benchkit.Median(hitCPU[a]), benchkit.Median(hitCPU[peer])
	p("### Repeated full clone served from the cache\n\n")
	p("No new commit; after a fresh commit the first clone from each packwire server made its response (fetch cache: %.2f s server CPU, %s; pack cache hook: %.2f s, %s), then %d single clones per server, servers in a fresh random order each time:\n\n",
		firsts[a].cpu.Seconds(), cacheString(firsts[a].cache, true), firsts[servers[1]].cpu.Seconds(), cacheString(firsts[servers[1]].cache, true), *hits)
	p("| server | server CPU per clone (median) | min - max | / git-http-backend | git CPU (governor) | peak RSS | outcome |\n|---|---:|---:|---:|---:|---:|---|\n")
	for _, s := range hitServers {
		cpus := hitCPU[s]
		gitCol := "-"
		if s.data != "" {
			gitCol = fmt.Sprintf("%.3f s", benchkit.Median(hitGit[s]).Seconds())
		}
		p("| %s | %.3f s | %.3f - %.3f s | %.3fx | %s | %s | %s |\n", s.name, benchkit.Median(cpus).Seconds(), benchkit.Percentile(cpus, 0).Seconds(), benchkit.Percentile(cpus, 100).Seconds(),
			benchkit.Median(cpus).Seconds()/mC.Seconds(), gitCol, mib(int64(benchkit.Median(hitRSS[s]))), cacheString(hitCache[s], s.data != ""))
	}
	hitRatio := mA.Seconds() / mC.Seconds()
	p("\nRatio packwire fetch-cache hit / git-http-backend: %.3fx\n\n", hitRatio)

	p("### What storing a response costs a single clone\n\n")
	p("%d pairs: a fresh commit, then one clone from packwire with the fetch cache (git runs and writes its answer into the cache file, and the client is sent it from there) and one from packwire without it, in random order.\n\n", *pairs)
	p("| | server CPU (median) | min - max |\n|---|---:|---:|\n")
	p("| fetch cache on | %.3f s | %.3f - %.3f s |\n", benchkit.Median(teeOn).Seconds(), benchkit.Percentile(teeOn, 0).Seconds(), benchkit.Percentile(teeOn, 100).Seconds())
	p("| fetch cache off | %.3f s | %.3f - %.3f s |\n\n", benchkit.Median(teeOff).Seconds(), benchkit.Percentile(teeOff, 0).Seconds(), benchkit.Percentile(teeOff, 100).Seconds())
	sort.Float64s(teeRatios)
	p("Per-pair ratio on/off: median %.3f, quartiles %.3f - %.3f, min-max %.3f - %.3f.\n\n", quantile(teeRatios, 0.5), quantile(teeRatios, 0.25), quantile(teeRatios, 0.75), teeRatios[0], teeRatios[len(teeRatios)-1])

	p("### Targets\n\n")
	yes := func(ok bool) string {
		if ok {
			return "met"
		}
		return "MISSED"
	}
	aName, bName, cName, dName := servers[0].name, servers[1].name, servers[2].name, servers[3].name
	if one, ok := med[key{aName, 1}]; ok {
		if sixteen, ok := med[key{aName, 16}]; ok {
			r := sixteen.Seconds() / one.Seconds()
			p("- 16-client herd at most 2.5x the server CPU of one clone (packwire with the fetch cache): %.2fx (%.2f s vs %.2f s): %s. ", r, sixteen.Seconds(), one.Seconds(), yes(r <= 2.5))
			p("Pack cache hook: %.2fx; no sharing: %.2fx; git-http-backend: %.2fx.\n",
				med[key{bName, 16}].Seconds()/med[key{bName, 1}].Seconds(), med[key{cName, 16}].Seconds()/med[key{cName, 1}].Seconds(),
				med[key{dName, 16}].Seconds()/med[key{dName, 1}].Seconds())
		}
	}
	p("- Repeated full clone from the cache at most 0.1x git-http-backend's server CPU: %.3fx (%.3f s vs %.3f s): %s\n", hitRatio, mA.Seconds(), mC.Seconds(), yes(hitRatio <= 0.1))
	lo, hi := sizes[0], sizes[len(sizes)-1]
	if hi > lo {
		growth := medPeak[key{aName, hi}] - medPeak[key{aName, lo}]
		bound := 2 * packSize
		p("- Server memory does not grow with pack size x clients (packwire with the fetch cache, peak memory herd of %d minus herd of %d below 2x the pack, %.0f MiB; pack x %d clients would be %.0f MiB): grew %s: %s. ",
			hi, lo, float64(bound)/(1<<20), hi, float64(packSize)*float64(hi)/(1<<20), mib(growth), yes(growth < bound))
		p("Pack cache hook: grew %s; no sharing: grew %s; git-http-backend: grew %s.\n",
			mib(medPeak[key{bName, hi}]-medPeak[key{bName, lo}]), mib(medPeak[key{cName, hi}]-medPeak[key{cName, lo}]), mib(medPeak[key{dName, hi}]-medPeak[key{dName, lo}]))
	}
	fmt.Print(b.String())
	os.WriteFile(filepath.Join(out, "results.md"), []byte(b.String()), 0o644)
}

func mib(n int64) string { return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20)) }

func cacheString(m map[string]int, packwire bool) string {
	if !packwire {
		return "-"
	}
	var parts []string
	for _, k := range []string{"generated", "replayed", "joined", "hit", "direct", "off"} {
		if m[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
		}
	}
	if len(parts) == 0 {
		return "(no records)"
	}
	return strings.Join(parts, ", ")
}

func must(err error) {
	if err != nil {
		benchkit.Fatalf("%v", err)
	}
}

// git runs git with the client environment and exits on failure.
func git(dir string, args ...string) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = clientEnv
	if b, err := cmd.CombinedOutput(); err != nil {
		benchkit.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, b)
	}
}

// newCommit commits a small file in the work clone and pushes it straight
// into the bare repository (no server involved), so the next clone asks
// for a pack nobody has made yet.
func newCommit(msg string) {
	commitSeq++
	must(os.WriteFile(filepath.Join(work, "HERD"), []byte(fmt.Sprintf("%d %s %s\n", commitSeq, msg, time.Now().UTC().Format(time.RFC3339Nano))), 0o644))
	git(work, "add", "HERD")
	git(work, "-c", "user.name=Bench", "-c", "user.email=bench@example.com", "commit", "-q", "-m", msg)
	git(work, "push", "-q", "origin", "HEAD:main")
	// The fetch cache trusts no refs changed within repostate.RacyWindow
	// (a change in the same clock tick could go unseen); a real herd comes
	// seconds after the push that triggered it.
	time.Sleep(2 * repostate.RacyWindow)
}

// quantile of sorted values, linear between neighbours.
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	pos := q * float64(len(sorted)-1)
	i := int(pos)
	if i+1 >= len(sorted) {
		return sorted[len(sorted)-1]
	}
	return sorted[i] + (pos-float64(i))*(sorted[i+1]-sorted[i])
}

// runHerd runs n concurrent full clones against s and measures the
// server's CPU and memory over the herd.
func runHerd(s *server, n int) herdResult {
	dirs := filepath.Join(out, "clones")
	os.RemoveAll(dirs)
	must(os.MkdirAll(dirs, 0o755))
	res := herdResult{walls: make([]time.Duration, n)}
	errMsgs := make([]string, n)
	clientCPU := make([]time.Duration, n)

	stopSampling := make(chan struct{})
	sampled := make(chan int64)
	s.group.ResetPeak()
	go func() {
		var peak int64
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			peak = max(peak, s.group.RSS())
			select {
			case <-stopSampling:
				sampled <- peak
				return
			case <-t.C:
			}
		}
	}()
	cpu0 := s.group.Read()
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			cmd := exec.Command("git", "-c", "protocol.version=2", "clone", "--no-local", "--no-checkout", "-q", s.url, filepath.Join(dirs, strconv.Itoa(i)))
			cmd.Env = clientEnv
			var stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = io.Discard, &stderr
			<-start
			t0 := time.Now()
			err := cmd.Run()
			res.walls[i] = time.Since(t0)
			if cmd.ProcessState != nil {
				clientCPU[i] = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
			}
			if err != nil {
				errMsgs[i] = strings.TrimSpace(fmt.Sprintf("%v: %s", err, stderr.String()))
			}
		}(i)
	}
	close(start)
	wg.Wait()
	time.Sleep(300 * time.Millisecond) // let the server reap and account stragglers
	res.cpu = s.group.Read() - cpu0
	res.peak = s.group.Peak()
	close(stopSampling)
	res.rssPeak = <-sampled
	for _, c := range clientCPU {
		res.client += c
	}
	for _, m := range errMsgs {
		if m != "" {
			res.errs++
			if res.errMsg == "" {
				res.errMsg = m
			}
		}
	}
	os.RemoveAll(dirs)
	return res
}

// packCacheCounts asks packwire's governor for the last records and counts
// the pack_cache outcomes of the last n fetches that made a pack. Records
// are written in batches: it waits until n such records show up.
func packCacheCounts(bin, data string, n int) map[string]int {
	c, _ := packCacheRecords(bin, data, n)
	return c
}

// packCacheRecords is packCacheCounts that also returns the git CPU (user +
// system of upload-pack and its children) the governor recorded for them.
func packCacheRecords(bin, data string, n int) (map[string]int, time.Duration) {
	var counts map[string]int
	var gitCPU time.Duration
	for try := 0; try < 40; try++ {
		counts = map[string]int{}
		gitCPU = 0
		recs, err := benchkit.GovernorRecords(bin, data, 8*n+16)
		if err == nil {
			// newest last: take records since the last one we saw
			seen := 0
			for i := len(recs) - 1; i >= 0 && seen < n; i-- {
				r := recs[i]
				if r.Kind != "full-clone" {
					continue
				}
				if lastSeen[data][r.ID] {
					continue
				}
				pc := r.PackCache
				if pc == "" {
					pc = "off"
				}
				counts[pc]++
				gitCPU += r.CPU()
				seen++
			}
			if seen == n {
				if lastSeen[data] == nil {
					lastSeen[data] = map[string]bool{}
				}
				for _, r := range recs {
					lastSeen[data][r.ID] = true
				}
				return counts, gitCPU
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	return counts, gitCPU // some records never showed up: the table shows fewer
}

var lastSeen = map[string]map[string]bool{}

// startPackwire starts packwire serving repos over HTTP in its own group,
// with its own data directory.
func startPackwire(bin, name, short, repos string, cacheFlags ...string) *server {
	data := filepath.Join(out, "data-"+short)
	benchkit.ShareRepos(data, repos)
	port := benchkit.FreePort()
	args := append([]string{"--maintain-interval", "0", "--git=", "--ssh=", "--http", "127.0.0.1:" + port,
		"--max-pack-jobs", "64", "--max-pack-jobs-per-repo", "64"}, cacheFlags...)
	p := benchkit.StartPackwire(short, bin, data, filepath.Join(out, "packwire-"+short+".log"), port, args...)
	return &server{name: name, short: short, url: "http://127.0.0.1:" + port + "/bench.git", group: p.Group, data: data, stop: p.Stop}
}

// startNginx starts the peer, nginx + fcgiwrap + git-http-backend, in its own group.
func startNginx(name, short, repos string) *server {
	p := benchkit.StartNginx(short, filepath.Join(out, "nginx"), repos)
	return &server{name: name, short: short, url: "http://127.0.0.1:" + p.Port + "/bench.git", group: p.Group, stop: p.Stop}
}
