package main

import (
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"packwire/bench/internal/benchkit"
	"packwire/internal/governor"
	"packwire/internal/lab/compare"
)

// bigSample is one cold herd (or single clone) of the big repository:
// the server's CPU, its memory high-water mark and the peak of its
// anonymous memory, and how many of the clones' requests ran git.
type bigSample struct {
	wall, cpu  time.Duration
	peak, rss  int64 // bytes above the group's usage at the start
	gitRuns    int   // clone requests that ran git (not followers or replays)
	errors     int
	baseline   int64
	answerSize int64
}

// bigStormWorkload is issue 18's big-repository storm: n cold identical
// clones at once against one cold clone, the peak memory of packwire's
// whole process tree (git children included) from its cgroup. Cold: a
// commit is pushed before each operation, so neither cache has the answer,
// and the group's page cache is reclaimed (memory.force_empty) so that
// every peak starts from the same place. Rounds interleave single clones
// and herds of every transport in a fresh random order.
func (s *setup) bigStormWorkload(r *report, herd int, transports map[string]bool) {
	if !s.packwire.Group.HasMemory() {
		benchkit.Fatalf("bigstorm needs the cgroup v1 memory controller (memory.max_usage_in_bytes)")
	}
	var variants []stormVariant
	for _, tr := range s.transports() {
		if transports[tr.name] {
			variants = append(variants, stormVariant{tr, 2})
		}
	}
	bare := filepath.Join(s.repos, s.repo+".git")
	work := filepath.Join(s.out, "bigstorm-work")
	s.mustGit(nil, s.out, "clone", "-q", "--no-checkout", bare, work)
	s.mustGit(nil, work, "checkout", "-q", "HEAD")
	defer os.RemoveAll(work)
	push := func(msg string) {
		s.smallCommit(work, msg)
		s.pushAsServed(work, "origin")
		time.Sleep(2 * time.Second) // a real herd comes seconds after its push (repostate.RacyWindow)
	}
	name := func(v stormVariant, n int) string { return fmt.Sprintf("%s x%d", v.name(), n) }
	type op struct {
		v stormVariant
		n int
	}
	var ops []op
	for _, v := range variants {
		ops = append(ops, op{v, 1}, op{v, herd})
	}
	got := map[string][]bigSample{}
	srv := s.packwire
	for round := -1; round < s.nRounds; round++ {
		for _, i := range rng.Perm(len(ops)) {
			o := ops[i]
			if round < 0 && o.n > 1 {
				continue // the warm-up only brings the repository into the page cache
			}
			push(fmt.Sprintf("bigstorm %s %d", name(o.v, o.n), round))
			smp := s.bigHerd(srv, o.v, o.n)
			log.Printf("round %d/%d %-16s wall %6.1fs CPU %6.1fs peak %6.0f MiB rss %6.0f MiB git runs %d errors %d (baseline %.0f MiB)",
				round+1, s.nRounds, name(o.v, o.n), smp.wall.Seconds(), smp.cpu.Seconds(), mibf(smp.peak), mibf(smp.rss), smp.gitRuns, smp.errors, mibf(smp.baseline))
			if round >= 0 {
				got[name(o.v, o.n)] = append(got[name(o.v, o.n)], smp)
			}
		}
	}

	r.section(fmt.Sprintf("Big repository: %d cold clones at once", herd), fmt.Sprintf(
		"packwire with its defaults (fetch cache on; `--maintain-interval 0 --max-connections 5000`), protocol v2 (git's default). "+
			"Before each operation a commit is pushed into the bare repository (so neither the fetch cache nor the pack cache has the answer) "+
			"and the page cache charged to packwire's memory cgroup is reclaimed (`memory.force_empty`), then `memory.max_usage_in_bytes` is reset. "+
			"Then one `git clone --no-checkout`, or %d at once. Peak: the cgroup's high-water mark (packwire and every git it starts: anonymous memory and the page cache it charges, "+
			"e.g. the fetch cache's answer file) minus its usage at the start; peak RSS: the cgroup's `total_rss` (anonymous memory only) sampled every 20 ms, minus its start. "+
			"git runs: clone requests the governor records as having run git (not followers or replays). "+
			"%d rounds after a warm-up of one single clone per transport, single clones and herds of every transport in a fresh random order; medians. Ratios: herd / single clone of the same run.",
		herd, s.nRounds))
	r.table("| transport | 1 clone wall | 1 clone CPU | 1 clone peak | 1 clone peak RSS | herd wall | herd CPU | herd peak | herd peak RSS | peak ratio | RSS ratio | CPU ratio | git runs per herd | answer | errors |",
		"|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, v := range variants {
		one, many := got[name(v, 1)], got[name(v, herd)]
		med := func(xs []bigSample, f func(bigSample) int64) int64 {
			d := make([]time.Duration, len(xs))
			for i, x := range xs {
				d[i] = time.Duration(f(x))
			}
			return int64(benchkit.Median(d))
		}
		wall := func(x bigSample) int64 { return int64(x.wall) }
		cpu := func(x bigSample) int64 { return int64(x.cpu) }
		peak := func(x bigSample) int64 { return x.peak }
		rss := func(x bigSample) int64 { return x.rss }
		runs := func(x bigSample) int64 { return int64(x.gitRuns) }
		size := func(x bigSample) int64 { return x.answerSize }
		nErr := 0
		for _, x := range append(append([]bigSample{}, one...), many...) {
			nErr += x.errors
		}
		peakRatio := float64(med(many, peak)) / float64(med(one, peak))
		rssRatio := float64(med(many, rss)) / float64(med(one, rss))
		cpuRatio := float64(med(many, cpu)) / float64(med(one, cpu))
		r.row(v.name(), secs(time.Duration(med(one, wall))), secs(time.Duration(med(one, cpu))), mibs(med(one, peak)), mibs(med(one, rss)),
			secs(time.Duration(med(many, wall))), secs(time.Duration(med(many, cpu))), mibs(med(many, peak)), mibs(med(many, rss)),
			ratio(peakRatio), ratio(rssRatio), ratio(cpuRatio), strconv.Itoa(int(med(many, runs))), mibs(med(one, size)), strconv.Itoa(nErr))
		r.target(fmt.Sprintf("%d cold clones of the big repository over %s: peak server memory <= 2.0x one clone's", herd, v.name()), peakRatio, 2.0, compare.Result{})
		r.target(fmt.Sprintf("%d cold clones of the big repository over %s: no failures", herd, v.name()), float64(nErr), 0, compare.Result{})
	}
	r.note("Per-round figures (wall s / CPU s / peak MiB / peak RSS MiB / git runs), in the order measured:")
	for _, v := range variants {
		for _, n := range []int{1, herd} {
			line := name(v, n) + ":"
			for _, x := range got[name(v, n)] {
				line += fmt.Sprintf(" %.1f/%.1f/%.0f/%.0f/%d;", x.wall.Seconds(), x.cpu.Seconds(), mibf(x.peak), mibf(x.rss), x.gitRuns)
			}
			r.note("- " + line)
		}
	}
}

// bigHerd runs n cold clones of the benchmark repository at once and
// measures the server around them.
func (s *setup) bigHerd(srv *benchkit.Server, v stormVariant, n int) bigSample {
	g := srv.Group
	g.Reclaim()
	time.Sleep(200 * time.Millisecond)
	var smp bigSample
	smp.baseline = g.Usage()
	rss0 := g.RSS()
	g.ResetPeak()
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if x := g.RSS() - rss0; x > smp.rss {
					smp.rss = x
				}
			}
		}
	}()
	start := time.Now()
	cpu0 := g.Read()
	url := v.tr.packwire(s.repo)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := filepath.Join(s.out, "bigstorm", strconv.Itoa(i))
			defer os.RemoveAll(dst)
			if _, err := s.git(v.tr.env, s.out, v.args("clone", "-q", "--no-checkout", url, dst)...); err != nil {
				mu.Lock()
				smp.errors++
				mu.Unlock()
				log.Print(err)
			}
		}()
	}
	wg.Wait()
	smp.wall = time.Since(start)
	time.Sleep(300 * time.Millisecond) // git children reaped, accounting settled
	smp.cpu = g.Read() - cpu0
	close(stop)
	sampler.Wait()
	smp.peak = g.Peak() - smp.baseline
	recs := s.cloneRecords(start)
	for _, rec := range recs {
		if rec.PackCache != "replayed" {
			smp.gitRuns++
		}
		if rec.BytesOut > smp.answerSize {
			smp.answerSize = rec.BytesOut
		}
	}
	return smp
}

// cloneRecords returns the governor's records of full clones that started
// after start.
func (s *setup) cloneRecords(start time.Time) []governor.Record {
	time.Sleep(700 * time.Millisecond) // records are written in batches
	recs, err := benchkit.GovernorRecords(s.bin, s.data, 200)
	if err != nil {
		benchkit.Fatalf("governor records: %v", err)
	}
	var out []governor.Record
	for _, r := range recs {
		if r.Kind == "full-clone" && r.Start.After(start) {
			out = append(out, r)
		}
	}
	return out
}

func mibf(n int64) float64 { return float64(n) / (1 << 20) }
func mibs(n int64) string  { return fmt.Sprintf("%.0f MiB", mibf(n)) }
