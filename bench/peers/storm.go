package main

import (
	"fmt"
	"log"
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

// stormParts is -storm-parts: the parts of the storm workload to run.
var stormParts = "cold,repeated,ci"

// stormPart tells whether -storm-parts names part.
func stormPart(part string) bool {
	for _, p := range strings.Split(stormParts, ",") {
		if strings.TrimSpace(p) == part {
			return true
		}
	}
	return false
}

// stormVariant is one transport spoken with one protocol version.
type stormVariant struct {
	tr      transport
	version int
}

func (v stormVariant) name() string { return fmt.Sprintf("%s v%d", v.tr.name, v.version) }

// args puts the protocol version in front of a git command.
func (v stormVariant) args(args ...string) []string {
	return append([]string{"-c", "protocol.version=" + strconv.Itoa(v.version)}, args...)
}

// stormWorkload measures the fetch cache on every transport and protocol
// version (issue 18): herds of identical cold clones against one clone,
// repeated clones against the peer, and CI runners at the same old commit
// fetching after a push against one such fetch. Ratios come from this run
// only; every figure is a median over the rounds, targets in a fresh
// random order each round.
func (s *setup) stormWorkload(r *report) {
	const herd = 16
	var variants []stormVariant
	for _, tr := range s.transports() {
		for _, v := range []int{0, 2} {
			variants = append(variants, stormVariant{tr, v})
		}
	}
	bare := filepath.Join(s.repos, s.repo+".git")
	work := filepath.Join(s.out, "storm-work")
	s.mustGit(nil, s.out, "clone", "-q", bare, work)
	defer os.RemoveAll(work)
	push := func(msg string) {
		s.smallCommit(work, msg)
		s.mustGit(nil, work, "push", "-q", "origin", "HEAD")
		// A real herd comes seconds after its push; the fetch cache does
		// not trust refs changed within repostate.RacyWindow.
		time.Sleep(2 * repostate.RacyWindow)
	}
	errs := map[string]int{}
	var mu sync.Mutex
	// together runs op(i) for i < n at once and returns the wall time.
	together := func(name string, n int, op func(i int) error) time.Duration {
		var wg sync.WaitGroup
		start := time.Now()
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := op(i); err != nil {
					mu.Lock()
					errs[name]++
					mu.Unlock()
					log.Print(err)
				}
			}()
		}
		wg.Wait()
		return time.Since(start)
	}
	sized := func(v stormVariant, n int) string { return fmt.Sprintf("%s x%d", v.name(), n) }
	var sizedTargets []target
	byName := map[string]stormVariant{}
	for _, v := range variants {
		for _, n := range []int{1, herd} {
			name := sized(v, n)
			byName[name] = v
			sizedTargets = append(sizedTargets, target{name: name, url: v.tr.packwire(s.repo), env: v.tr.env, server: v.tr.pwServer})
		}
	}
	sizeOf := func(t target) int {
		if t.name == sized(byName[t.name], 1) {
			return 1
		}
		return herd
	}
	// The same CI herd against each transport's peer, for scale: the
	// target compares packwire with itself.
	peerHerd := func(v stormVariant) string { return fmt.Sprintf("%s v%d x%d", v.tr.peerName, v.version, herd) }
	ciTargets := append([]target(nil), sizedTargets...)
	for _, v := range variants {
		name := peerHerd(v)
		byName[name] = v
		ciTargets = append(ciTargets, target{name: name, url: v.tr.peer(s.repo), env: v.tr.env, server: v.tr.peerSrv})
	}

	// 1. Cold herds: a push before each, so no answer is cached.
	cold := map[string][]sample{}
	if stormPart("cold") {
		log.Print("storm: cold clone herds per transport and protocol version ...")
		cold = s.rounds(sizedTargets, func(t target, round int) sample {
			v, n := byName[t.name], sizeOf(t)
			push(fmt.Sprintf("storm cold %s %d", t.name, round))
			return measure(t.server, func() time.Duration {
				return together(t.name, n, func(i int) error {
					dst := filepath.Join(s.out, "storm", strconv.Itoa(i))
					defer os.RemoveAll(dst)
					_, err := s.git(t.env, s.out, v.args("clone", "-q", "--no-checkout", t.url, dst)...)
					return err
				})
			})
		})
	}

	// 2. Repeated full clones of the unchanged repository, packwire and
	// its peer (the warm-up round makes packwire's answers).
	log.Print("storm: repeated clones against the peers ...")
	var pairTargets []target
	for _, v := range variants {
		pairTargets = append(pairTargets,
			target{name: "packwire " + v.name(), url: v.tr.packwire(s.repo), env: v.tr.env, server: v.tr.pwServer},
			target{name: v.tr.peerName + " v" + strconv.Itoa(v.version), url: v.tr.peer(s.repo), env: v.tr.env, server: v.tr.peerSrv})
	}
	versionOf := map[string]stormVariant{}
	for i, t := range pairTargets {
		versionOf[t.name] = variants[i/2]
	}
	dst := filepath.Join(s.out, "storm-clone")
	repeated := map[string][]sample{}
	if stormPart("repeated") {
		repeated = s.rounds(pairTargets, func(t target, _ int) sample {
			os.RemoveAll(dst)
			v := versionOf[t.name]
			return measure(t.server, func() time.Duration {
				return s.mustGit(t.env, s.out, v.args("clone", "-q", "--no-checkout", t.url, dst)...)
			})
		})
		os.RemoveAll(dst)
	}

	// 3. CI runners: n identical clones at the tip, a push, then all of
	// them fetch at once. Their fetches have the same haves.
	runners := filepath.Join(s.out, "storm-runners")
	gitRuns := map[string][]time.Duration{} // git runs per CI herd (as durations, for Median)
	ci := map[string][]sample{}
	if stormPart("ci") {
		log.Print("storm: CI runners fetching after a push ...")
		ci = s.rounds(ciTargets, func(t target, round int) sample {
			v, n := byName[t.name], sizeOf(t)
			os.RemoveAll(runners)
			base := filepath.Join(runners, "base")
			s.mustGit(nil, s.out, "clone", "-q", "--no-checkout", "file://"+bare, base)
			s.mustGit(nil, base, "remote", "set-url", "origin", t.url)
			for i := 0; i < n; i++ {
				if b, err := exec.Command("cp", "-a", base, filepath.Join(runners, strconv.Itoa(i))).CombinedOutput(); err != nil {
					benchkit.Fatalf("cp: %v %s", err, b)
				}
			}
			push(fmt.Sprintf("storm ci %s %d", t.name, round))
			start := time.Now()
			smp := measure(t.server, func() time.Duration {
				return together(t.name+" fetch", n, func(i int) error {
					_, err := s.git(t.env, filepath.Join(runners, strconv.Itoa(i)), v.args("fetch", "-q", "origin")...)
					return err
				})
			})
			if round >= 0 && t.server == s.packwire {
				gitRuns[t.name] = append(gitRuns[t.name], time.Duration(s.fetchGitRuns(start)))
			}
			return smp
		})
		os.RemoveAll(runners)
	}

	r.section("Storms on every transport (fetch cache)", fmt.Sprintf(
		"packwire with its defaults (fetch cache on) over git://, SSH and HTTP, each with protocol v0 and v2 (`-c protocol.version=N`). "+
			"Cold herds: a commit pushed into the bare repository before each herd, then %d concurrent `git clone --no-checkout` (or one). "+
			"Repeated clones: the unchanged repository, single clones, packwire and the transport's peer in one shuffled round. "+
			"CI runners: %d copies of one clone at the tip (or one), a pushed commit, then `git fetch` in all of them at once; git runs: the fetch requests (rounds included) that ran git by packwire's governor; the second table runs the same 16-runner herd against each transport's peer, in the same shuffled rounds. "+
			"Server CPU is the cgroup delta of the server's whole process tree over the operation; %d rounds after one warm-up round, targets shuffled per round; medians.",
		herd, herd, s.nRounds))
	r.table("| transport | 1 clone CPU | 16 clones CPU | ratio | 16 CI fetches CPU | 1 fetch CPU | ratio | git runs per 16 CI fetches | repeated clone packwire | peer | ratio (95% CI) | errors |",
		"|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, v := range variants {
		one, many := benchkit.Median(cpus(cold[sized(v, 1)])), benchkit.Median(cpus(cold[sized(v, herd)]))
		fOne, fMany := benchkit.Median(cpus(ci[sized(v, 1)])), benchkit.Median(cpus(ci[sized(v, herd)]))
		coldRatio, ciRatio := many.Seconds()/one.Seconds(), fMany.Seconds()/fOne.Seconds()
		nErr := errs[sized(v, 1)] + errs[sized(v, herd)] + errs[sized(v, 1)+" fetch"] + errs[sized(v, herd)+" fetch"]
		row := []string{v.name(), "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", strconv.Itoa(nErr)}
		if stormPart("cold") {
			row[1], row[2], row[3] = ms(one), ms(many), ratio(coldRatio)
			r.target(fmt.Sprintf("16 cold identical clones over %s <= 2.0x one clone's server CPU", v.name()), coldRatio, 2.0, compare.Result{})
		}
		if stormPart("repeated") {
			pw, peer := repeated["packwire "+v.name()], repeated[v.tr.peerName+" v"+strconv.Itoa(v.version)]
			hit := compare.Analyze(cpus(peer), cpus(pw))
			row[8], row[9], row[10] = ms(hit.BMedian), ms(hit.AMedian), ratioCI(hit)
			r.target(fmt.Sprintf("repeated full clone over %s <= 0.1x %s's server CPU", v.name(), v.tr.peerName), hit.MedianRatio, 0.1, hit)
		}
		if stormPart("ci") {
			row[4], row[5], row[6], row[7] = ms(fMany), ms(fOne), ratio(ciRatio), strconv.Itoa(int(benchkit.Median(gitRuns[sized(v, herd)])))
			r.target(fmt.Sprintf("16 CI runners fetching after a push over %s <= 2.0x one such fetch", v.name()), ciRatio, 2.0, compare.Result{})
		}
		r.row(row...)
		if stormPart("cold") {
			s.coldOneClone[v.name()] = one
		}
		if stormPart("ci") {
			s.ciOneFetch[v.name()] = fOne
		}
	}
	if stormPart("ci") {
		r.note("The same 16-runner CI herds against each transport's peer, in the same shuffled rounds:")
		r.table("| transport | packwire: 16 CI fetches CPU | peer | peer: 16 CI fetches CPU | packwire / peer |", "|---|---:|---|---:|---:|")
		for _, v := range variants {
			pw, peer := benchkit.Median(cpus(ci[sized(v, herd)])), benchkit.Median(cpus(ci[peerHerd(v)]))
			r.row(v.name(), ms(pw), v.tr.peerName, ms(peer), ratio(pw.Seconds()/peer.Seconds()))
		}
	}
}

// fetchGitRuns counts the fetch requests since start that packwire's
// governor records as having run git (generated by the fetch cache, or
// not through it): a CI herd whose fetches are shared has one.
func (s *setup) fetchGitRuns(start time.Time) int {
	time.Sleep(700 * time.Millisecond) // records are written in batches
	recs, err := benchkit.GovernorRecords(s.bin, s.data, 400)
	if err != nil {
		benchkit.Fatalf("governor records: %v", err)
	}
	n := 0
	for _, r := range recs {
		fetch := r.Kind == "incremental-fetch" || r.Kind == "negotiation"
		if fetch && r.Start.After(start) && r.PackCache != "replayed" {
			n++
		}
	}
	return n
}
