package main

import (
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"packwire/bench/internal/benchkit"
	"packwire/internal/lab/compare"
	"packwire/internal/repostate"
)

// sample is one measured operation: client wall and the server's CPU
// (the cgroup delta over the operation).
type sample struct{ wall, cpu time.Duration }

// target is one server reached one way.
type target struct {
	name   string
	url    string
	env    []string
	server *benchkit.Server
}

// measure runs op and reads the server's CPU around it. The server's
// work for a finished request trails the client's exit: git's children
// are reaped a moment later, and packwire writes its request records in
// batches every 500 ms (the governor's FlushInterval). So it waits
// settle after op before reading: each operation pays for its own
// records, where before a batch landed in whichever operation's window
// its tick fell (in a herd's more often than in a single fetch's, whose
// window is shorter), which moved 10-30 ms figures by several ms.
func measure(srv *benchkit.Server, op func() time.Duration) sample {
	var cpu0 time.Duration
	if srv != nil {
		cpu0 = srv.Group.Read()
	}
	wall := op()
	if srv == nil {
		return sample{wall: wall}
	}
	time.Sleep(settle)
	return sample{wall: wall, cpu: srv.Group.Read() - cpu0}
}

// settle is how long measure waits after an operation: a governor flush
// (500 ms) and a margin.
const settle = 650 * time.Millisecond

var rng = rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))

// rounds runs every target's op once per round in a fresh random order,
// after one warm-up round that is not kept, and returns samples by target.
func (s *setup) rounds(targets []target, op func(t target, round int) sample) map[string][]sample {
	got := map[string][]sample{}
	for r := -1; r < s.nRounds; r++ {
		for _, i := range rng.Perm(len(targets)) {
			t := targets[i]
			smp := op(t, r)
			if r >= 0 {
				got[t.name] = append(got[t.name], smp)
			}
			fmt.Fprintf(os.Stderr, "\rround %d/%d %-40s %7.3fs", r+1, s.nRounds, t.name, smp.wall.Seconds())
		}
	}
	fmt.Fprintln(os.Stderr)
	return got
}

func walls(v []sample) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = x.wall
	}
	return out
}

func cpus(v []sample) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = x.cpu
	}
	return out
}

// pairTargets are packwire's and the peer's targets for the benchmark
// repository on each transport.
func (s *setup) pairTargets() ([]target, []transport) {
	var targets []target
	trs := s.transports()
	for _, tr := range trs {
		targets = append(targets,
			target{name: "packwire " + tr.name, url: tr.packwire(s.repo), env: tr.env, server: tr.pwServer},
			target{name: tr.peerName, url: tr.peer(s.repo), env: tr.env, server: tr.peerSrv})
	}
	return targets, trs
}

// cloneEach makes one clone per target under OUT/sub and returns their
// directories by target name.
func (s *setup) cloneEach(targets []target, sub string) map[string]string {
	dirs := map[string]string{}
	for i, t := range targets {
		dir := filepath.Join(s.out, sub, strconv.Itoa(i))
		s.mustGit(t.env, s.out, "clone", "-q", "--no-checkout", t.url, dir)
		dirs[t.name] = dir
	}
	return dirs
}

// fetchTable writes a fetch workload's wall and server CPU per transport,
// packwire against its peer, and returns the CPU comparison by transport.
func fetchTable(r *report, trs []transport, got map[string][]sample) map[string]compare.Result {
	r.table("| transport | packwire wall | peer | peer wall | wall ratio (95% CI) | server CPU packwire | server CPU peer | CPU ratio (95% CI) |",
		"|---|---:|---|---:|---:|---:|---:|---:|")
	cpuBy := map[string]compare.Result{}
	for _, tr := range trs {
		pw, peer := got["packwire "+tr.name], got[tr.peerName]
		wall := compare.Analyze(walls(peer), walls(pw))
		cpu := compare.Analyze(cpus(peer), cpus(pw))
		r.row(tr.name, ms(wall.BMedian), tr.peerName, ms(wall.AMedian), ratioCI(wall), ms(cpu.BMedian), ms(cpu.AMedian), ratioCI(cpu))
		cpuBy[tr.name] = cpu
	}
	return cpuBy
}

func (s *setup) cloneWorkload(r *report) {
	log.Print("full clone per transport ...")
	targets, trs := s.pairTargets()
	targets = append(targets, target{name: "file://", url: "file://" + filepath.Join(s.repos, s.repo+".git")})
	dst := filepath.Join(s.out, "clone")
	got := s.rounds(targets, func(t target, _ int) sample {
		os.RemoveAll(dst)
		return measure(t.server, func() time.Duration {
			return s.mustGit(t.env, s.out, "clone", "-q", "--no-local", "--no-checkout", t.url, dst)
		})
	})
	os.RemoveAll(dst)
	r.section("Full clone", fmt.Sprintf("`git clone --no-local --no-checkout`, %d rounds after one warm-up, the 7 targets in a fresh random order each round. "+
		"Ratios are packwire / peer per round (pairs from the same round); median with a 95%% bootstrap interval. "+
		"packwire runs its defaults: over HTTP, a clone identical to an earlier one is replayed from the fetch cache (no git process), "+
		"which is what repeated clones of an unchanged repository get; git:// and SSH run git every time.", s.nRounds))
	r.table("| transport | packwire wall | peer | peer wall | wall ratio (95% CI) | packwire / file:// | server CPU packwire | server CPU peer | CPU ratio |",
		"|---|---:|---|---:|---:|---:|---:|---:|---:|")
	file := got["file://"]
	for _, tr := range trs {
		pw, peer := got["packwire "+tr.name], got[tr.peerName]
		wall := compare.Analyze(walls(peer), walls(pw))
		vsFile := compare.Analyze(walls(file), walls(pw))
		cpu := compare.Analyze(cpus(peer), cpus(pw))
		r.row(tr.name, secs(wall.BMedian), tr.peerName, secs(wall.AMedian), ratioCI(wall), ratioCI(vsFile),
			secs(cpu.BMedian), secs(cpu.AMedian), ratio(cpu.MedianRatio))
		r.target(fmt.Sprintf("full clone wall over %s <= 1.00x %s", tr.name, tr.peerName), wall.MedianRatio, 1.00, wall)
		r.target(fmt.Sprintf("full clone wall over %s <= 1.02x file://", tr.name), vsFile.MedianRatio, 1.02, vsFile)
	}
	r.note(fmt.Sprintf("file:// median %s.", secs(benchkit.Median(walls(file)))))
}

// noopWorkload fetches into up-to-date clones: the advertisement and
// negotiation only. Server CPU is per fetch over a batch of ten.
func (s *setup) noopWorkload(r *report) {
	log.Print("no-op fetch per transport ...")
	const batch = 10
	targets, trs := s.pairTargets()
	dirs := s.cloneEach(targets, "noop")
	got := s.rounds(targets, func(t target, _ int) sample {
		smp := measure(t.server, func() time.Duration {
			var total time.Duration
			for i := 0; i < batch; i++ {
				total += s.mustGit(t.env, dirs[t.name], "fetch", "-q", "origin")
			}
			return total
		})
		return sample{wall: smp.wall / batch, cpu: smp.cpu / batch}
	})
	os.RemoveAll(filepath.Join(s.out, "noop"))
	r.section("No-op fetch", fmt.Sprintf("`git fetch` into an up-to-date clone; each sample is the mean of a batch of %d fetches, %d rounds, shuffled.", batch, s.nRounds))
	cpu := fetchTable(r, trs, got)["HTTP"]
	r.target("no-op fetch server CPU over HTTP <= 0.5x git-http-backend", cpu.MedianRatio, 0.5, cpu)
}

// incrementalWorkload pushes a small commit straight into the bare
// repository, then every target fetches it into its own clone.
func (s *setup) incrementalWorkload(r *report) {
	log.Print("incremental fetch after a small push ...")
	targets, trs := s.pairTargets()
	dirs := s.cloneEach(targets, "incr")
	work := filepath.Join(s.out, "incr", "work")
	bare := filepath.Join(s.repos, s.repo+".git")
	s.mustGit(nil, s.out, "clone", "-q", bare, work)
	pushed := -2
	got := s.rounds(targets, func(t target, round int) sample {
		if round != pushed { // one push per round, before its first fetch
			pushed = round
			s.smallCommit(work, fmt.Sprintf("incremental %d", round))
			s.mustGit(nil, work, "push", "-q", "origin", "HEAD")
		}
		return measure(t.server, func() time.Duration {
			return s.mustGit(t.env, dirs[t.name], "fetch", "-q", "origin")
		})
	})
	os.RemoveAll(filepath.Join(s.out, "incr"))
	r.section("Incremental fetch", fmt.Sprintf("Before each round one commit changing three files is pushed into the bare repository; then each target fetches it into its own clone. %d rounds, shuffled.", s.nRounds))
	fetchTable(r, trs, got)
}

// smallCommit changes three files of a work tree and commits.
func (s *setup) smallCommit(work, msg string) {
	out := benchkit.Output("git", "-C", work, "ls-files")
	files := strings.Fields(out)
	for i := 0; i < 3 && len(files) > 0; i++ {
		f := filepath.Join(work, files[rng.IntN(len(files))])
		fh, err := os.OpenFile(f, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			benchkit.Fatalf("%v", err)
		}
		fmt.Fprintf(fh, "\n// %s %d\n", msg, rng.Int64())
		fh.Close()
	}
	s.mustGit([]string{"GIT_AUTHOR_NAME=bench", "GIT_AUTHOR_EMAIL=bench@invalid", "GIT_COMMITTER_NAME=bench", "GIT_COMMITTER_EMAIL=bench@invalid"},
		work, "commit", "-q", "-am", msg)
}

// mirrorWorkload pushes a repository with about 5,000 refs with
// `git push --mirror` into a new empty repository, over SSH and HTTP.
func (s *setup) mirrorWorkload(r *report) {
	const refs = 5000
	log.Printf("mirror push of %d refs ...", refs)
	src := filepath.Join(s.out, "mirror-src.git")
	s.mustGit(nil, s.out, "clone", "-q", "--mirror", filepath.Join(s.repos, s.repo+".git"), src)
	commits := strings.Fields(benchkit.Output("git", "-C", src, "rev-list", "--all", "--max-count=100000"))
	var in strings.Builder
	existing := len(strings.Split(strings.TrimSpace(benchkit.Output("git", "-C", src, "for-each-ref", "--format=%(refname)")), "\n"))
	for i := existing; i < refs; i++ {
		fmt.Fprintf(&in, "create refs/heads/mirror/%05d %s\n", i, commits[(i*7919)%len(commits)])
	}
	cmd := exec.Command("git", "-C", src, "update-ref", "--stdin")
	cmd.Stdin = strings.NewReader(in.String())
	if b, err := cmd.CombinedOutput(); err != nil {
		benchkit.Fatalf("update-ref: %v\n%s", err, b)
	}
	total := len(strings.Split(strings.TrimSpace(benchkit.Output("git", "-C", src, "for-each-ref", "--format=%(refname)")), "\n"))
	var targets []target
	var trs []transport
	for _, tr := range s.transports() {
		if tr.name == "git://" {
			continue // push over git:// is refused by packwire and off by default in git daemon
		}
		trs = append(trs, tr)
		targets = append(targets,
			target{name: "packwire " + tr.name, env: tr.env, server: tr.pwServer},
			target{name: tr.peerName, env: tr.env, server: tr.peerSrv})
	}
	n := 0
	got := s.rounds(targets, func(t target, _ int) sample {
		n++
		name := fmt.Sprintf("mirror-%d", n)
		var url string
		for _, tr := range trs {
			if t.name == "packwire "+tr.name {
				benchkit.Run(s.bin, "repo", "create", name, "--data", s.data)
				url = s.pushURL(tr.packwire(name))
			} else if t.name == tr.peerName {
				benchkit.Run("git", "init", "-q", "--bare", filepath.Join(s.repos, name+".git"))
				benchkit.Run("git", "-C", filepath.Join(s.repos, name+".git"), "config", "http.receivepack", "true")
				url = tr.peer(name)
			}
		}
		smp := measure(t.server, func() time.Duration {
			return s.mustGit(t.env, src, "push", "-q", "--mirror", url)
		})
		// Every ref arrived and the repository is sound.
		dst := filepath.Join(s.repos, name+".git")
		if got := len(strings.Split(strings.TrimSpace(benchkit.Output("git", "-C", dst, "for-each-ref", "--format=%(refname)")), "\n")); got != total {
			benchkit.Fatalf("%s: %d refs after the mirror push, want %d", t.name, got, total)
		}
		benchkit.Run("git", "-C", dst, "fsck", "--connectivity-only", "--no-progress")
		os.RemoveAll(dst)
		return smp
	})
	os.RemoveAll(src)
	r.section("Mirror push", fmt.Sprintf("`git push --mirror` of %d refs (the benchmark repository plus branches at spread commits) into a new empty repository; refs counted and `git fsck --connectivity-only` after every push. %d rounds, shuffled.", total, s.nRounds))
	r.table("| transport | packwire wall | peer | peer wall | wall ratio (95% CI) | server CPU packwire | server CPU peer |",
		"|---|---:|---|---:|---:|---:|---:|")
	for _, tr := range trs {
		pw, peer := got["packwire "+tr.name], got[tr.peerName]
		wall := compare.Analyze(walls(peer), walls(pw))
		r.row(tr.name, secs(wall.BMedian), tr.peerName, secs(wall.AMedian), ratioCI(wall), secs(benchkit.Median(cpus(pw))), secs(benchkit.Median(cpus(peer))))
		if tr.name == "SSH" {
			r.target("5,000-ref mirror push over SSH <= 1.5x OpenSSH + git", wall.MedianRatio, 1.5, wall)
		}
	}
}

// herdWorkload starts 16 identical clones at once over HTTP. Before every
// herd a small commit is pushed, so no server has the pack cached.
func (s *setup) herdWorkload(r *report) {
	const size = 16
	log.Printf("herds of %d clones over HTTP ...", size)
	sharePort := benchkit.FreePort()
	shareData := filepath.Join(s.out, "data-sharing")
	benchkit.ShareRepos(shareData, s.repos)
	unshared := benchkit.StartPackwire("packwire-unshared", s.bin, shareData, filepath.Join(s.out, "packwire-unshared.log"), sharePort,
		"--maintain-interval", "0", "--git=", "--ssh=", "--http", "127.0.0.1:"+sharePort, "--fetch-cache=false")
	defer unshared.Stop()
	targets := []target{
		{name: "packwire (default: fetch cache)", url: "http://127.0.0.1:" + s.pwHTTP + "/" + s.repo + ".git", server: s.packwire},
		{name: "packwire --fetch-cache=false", url: "http://127.0.0.1:" + sharePort + "/" + s.repo + ".git", server: unshared},
		{name: "nginx + git-http-backend", url: "http://127.0.0.1:" + s.nginx.Port + "/" + s.repo + ".git", server: s.nginx},
	}
	work := filepath.Join(s.out, "herd-work")
	s.mustGit(nil, s.out, "clone", "-q", filepath.Join(s.repos, s.repo+".git"), work)
	errs := map[string]int{}
	var mu sync.Mutex
	got := s.rounds(targets, func(t target, round int) sample {
		s.smallCommit(work, "herd")
		s.mustGit(nil, work, "push", "-q", "origin", "HEAD")
		// The fetch cache does not trust refs changed within
		// repostate.RacyWindow (racy timestamps); a real herd comes
		// seconds after its push.
		time.Sleep(2 * repostate.RacyWindow)
		return measure(t.server, func() time.Duration {
			var wg sync.WaitGroup
			start := time.Now()
			for i := 0; i < size; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					dst := filepath.Join(s.out, "herd", strconv.Itoa(i))
					defer os.RemoveAll(dst)
					if _, err := s.git(nil, s.out, "clone", "-q", "--no-checkout", t.url, dst); err != nil {
						mu.Lock()
						errs[t.name]++
						mu.Unlock()
						log.Print(err)
					}
				}()
			}
			wg.Wait()
			return time.Since(start)
		})
	})
	os.RemoveAll(work)
	r.section("Herd of 16 identical clones (HTTP)", fmt.Sprintf("16 concurrent `git clone --no-checkout` of the same repository; a new commit before each herd, so no pack is cached in advance. Server CPU is the cgroup delta over the herd. %d rounds, shuffled.", s.nRounds))
	r.table("| server | herd wall | server CPU per herd | CPU / peer (95% CI) | errors |", "|---|---:|---:|---:|---:|")
	peer := got["nginx + git-http-backend"]
	for _, t := range targets {
		c := compare.Analyze(cpus(peer), cpus(got[t.name]))
		r.row(t.name, secs(benchkit.Median(walls(got[t.name]))), secs(benchkit.Median(cpus(got[t.name]))), ratioCI(c), strconv.Itoa(errs[t.name]))
		if t.name != "nginx + git-http-backend" {
			r.target("16-clone herd server CPU, "+t.name+" <= 0.25x git-http-backend", c.MedianRatio, 0.25, c)
		}
	}
}

// loadWorkload runs 64 clone loops and one pusher against a server for a
// while, then checks every pushed commit is on the server's branch.
func (s *setup) loadWorkload(r *report, d time.Duration) {
	const clients = 64
	log.Printf("%d concurrent clones + a pusher for %s per server ...", clients, d)
	r.section(fmt.Sprintf("Load: %d concurrent clone loops and a pusher for %s", clients, d),
		"Each client clones (`--no-checkout`) in a loop until the time is up; clones running then finish. The pusher commits three changed files and pushes to branch `load` every 500 ms over the same transport. Lost pushes = acknowledged pushes whose commit is not in the server's branch at the end.")
	r.table("| server | clones | errors | clone wall p50 | p95 | pushes | push errors | lost pushes | server CPU |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, tr := range s.transports() {
		for _, pw := range []bool{true, false} {
			name, url, srv := tr.peerName, tr.peer(s.repo), tr.peerSrv
			if pw {
				name, url, srv = "packwire "+tr.name, tr.packwire(s.repo), tr.pwServer
			}
			if tr.name == "git://" && !pw {
				continue // git daemon refuses pushes by default; its clone storms are in the herd rows
			}
			pushURL := url
			if pw {
				pushURL = s.pushURL(url)
			}
			res := s.load(clients, d, url, pushURL, tr.env, srv, tr.name != "git://")
			r.row(name, strconv.Itoa(res.clones), strconv.Itoa(res.errors), secs(benchkit.Percentile(res.walls, 50)), secs(benchkit.Percentile(res.walls, 95)),
				strconv.Itoa(res.pushes), strconv.Itoa(res.pushErrors), strconv.Itoa(res.lost), secs(res.cpu))
			if pw {
				r.target("load over "+tr.name+": 0 errors and 0 lost pushes", float64(res.errors+res.lost), 0, compare.Result{})
			}
			if len(res.firstErrors) > 0 {
				r.note(name + " errors, first ones: " + strings.Join(res.firstErrors, "; "))
			}
		}
	}
}

type loadResult struct {
	clones, errors, pushes, pushErrors, lost int
	walls                                    []time.Duration
	cpu                                      time.Duration
	firstErrors                              []string
}

func (s *setup) load(clients int, d time.Duration, url, pushURL string, env []string, srv *benchkit.Server, push bool) loadResult {
	var res loadResult
	var mu sync.Mutex
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if len(res.firstErrors) < 3 {
			res.firstErrors = append(res.firstErrors, err.Error())
		}
	}
	// The pusher's clone is made before the storm, so it pushes from the start.
	work := filepath.Join(s.out, "load-pusher")
	if push {
		os.RemoveAll(work)
		s.mustGit(env, s.out, "clone", "-q", pushURL, work)
		s.mustGit(nil, work, "checkout", "-q", "-B", "load")
	}
	cpu0 := srv.Group.Read()
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := filepath.Join(s.out, "load", strconv.Itoa(c))
			for time.Now().Before(deadline) {
				os.RemoveAll(dst)
				wall, err := s.git(env, s.out, "clone", "-q", "--no-checkout", url, dst)
				mu.Lock()
				res.clones++
				if err != nil {
					res.errors++
				} else {
					res.walls = append(res.walls, wall)
				}
				mu.Unlock()
				if err != nil {
					fail(err)
				}
			}
			os.RemoveAll(dst)
		}()
	}
	var pushed []string
	if push {
		for time.Now().Before(deadline) {
			s.smallCommit(work, "load")
			head := strings.TrimSpace(benchkit.Output("git", "-C", work, "rev-parse", "HEAD"))
			res.pushes++
			if _, err := s.git(env, work, "push", "-q", "origin", "load"); err != nil {
				res.pushErrors++
				fail(err)
				// Start over from what the server has, so the next push is a fast-forward.
				s.git(env, work, "fetch", "-q", "origin")
				s.git(nil, work, "reset", "-q", "--hard", "origin/load")
			} else {
				pushed = append(pushed, head)
			}
			time.Sleep(500 * time.Millisecond)
		}
		os.RemoveAll(work)
	}
	wg.Wait()
	time.Sleep(300 * time.Millisecond)
	res.cpu = srv.Group.Read() - cpu0
	bare := filepath.Join(s.repos, s.repo+".git")
	for _, c := range pushed {
		if exec.Command("git", "-C", bare, "merge-base", "--is-ancestor", c, "refs/heads/load").Run() != nil {
			res.lost++
		}
	}
	if push {
		benchkit.Run("git", "-C", bare, "update-ref", "-d", "refs/heads/load")
	}
	os.RemoveAll(filepath.Join(s.out, "load"))
	return res
}
