package main

import (
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"packwire/bench/internal/benchkit"
	"packwire/internal/lab/compare"
)

// gcCopy is the name of the benchmark repository's copy in git's own gc
// layout (made before `packwire maintain`, which only touches s.repo).
func (s *setup) gcCopy() string { return s.repo + "-gc" }

// coldCloneWorkload compares a cold full clone over git:// (protocol v2):
// packwire serving the maintained repository against git daemon serving
// the same history in git's own `git gc` layout (issue 18's target), and
// git daemon serving the maintained files (what the layout alone gives).
// Cold: one commit is pushed into both repositories before each round, so
// packwire's fetch cache has no answer and every server runs
// pack-objects; each repository is then put back into its layout
// (`packwire maintain`, `git gc`), as their schedulers would. Each
// target's first clone is checked with `git fsck`.
func (s *setup) coldCloneWorkload(r *report) {
	log.Print("cold full clone: packwire (maintained) against git daemon (git gc layout) ...")
	bare := filepath.Join(s.repos, s.repo+".git")
	gcBare := filepath.Join(s.repos, s.gcCopy()+".git")
	work := filepath.Join(s.out, "coldclone-work")
	s.mustGit(nil, s.out, "clone", "-q", "--no-checkout", bare, work)
	s.mustGit(nil, work, "checkout", "-q", "HEAD")
	s.mustGit(nil, work, "remote", "add", "gc", gcBare)
	defer os.RemoveAll(work)
	daemonURL := func(repo string) string { return "git://127.0.0.1:" + s.daemon.Port + "/" + repo + ".git" }
	targets := []target{
		{name: "packwire, maintained", url: "git://127.0.0.1:" + s.pwGit + "/" + s.repo + ".git", server: s.packwire},
		{name: "git daemon, git gc layout", url: daemonURL(s.gcCopy()), server: s.daemon},
		{name: "git daemon, maintained", url: daemonURL(s.repo), server: s.daemon},
	}
	dst := filepath.Join(s.out, "coldclone")
	pushed := -2
	checked := map[string]bool{}
	got := s.rounds(targets, func(t target, round int) sample {
		// The same new commit in both repositories once per round: packwire
		// is cloned once per round, so its fetch cache never has the answer.
		if round != pushed {
			pushed = round
			s.smallCommit(work, fmt.Sprintf("cold clone %d", round))
			s.pushAsServed(work, "origin")
			// packwire's scheduler folds pushes into the layout as gc does
			// for git; without it, eight rounds of push packs cost its
			// pack-objects a third more than a maintained layout.
			benchkit.Run(s.bin, "maintain", "--data", s.data, s.repo)
			// git's own layout after a push is gc's: one pack, bitmap, no
			// loose objects (each costs pack-objects a deflate on every
			// clone: those of a few pushes tripled a clone's CPU here).
			s.mustGit(nil, work, "push", "-q", "gc", "HEAD")
			benchkit.Run("git", "-C", gcBare, "gc", "--quiet", "--prune=now")
			time.Sleep(2 * time.Second) // older than repostate.RacyWindow, as a real clone after a push
		}
		os.RemoveAll(dst)
		smp := measure(t.server, func() time.Duration {
			return s.mustGit(nil, s.out, "clone", "-q", "--no-checkout", t.url, dst)
		})
		if !checked[t.name] {
			checked[t.name] = true
			s.mustGit(nil, dst, "fsck", "--no-progress", "--no-dangling")
		}
		return smp
	})
	os.RemoveAll(dst)

	pw, gcPeer, sameFiles := got[targets[0].name], got[targets[1].name], got[targets[2].name]
	vsGC := compare.Analyze(cpus(gcPeer), cpus(pw))
	vsSame := compare.Analyze(cpus(sameFiles), cpus(pw))
	layout := compare.Analyze(cpus(gcPeer), cpus(sameFiles))
	wall := compare.Analyze(walls(gcPeer), walls(pw))
	r.section("Cold full clone: packwire (maintained layout) against git daemon (git gc layout)", fmt.Sprintf(
		"`git clone --no-checkout` over git:// with protocol v2 (git's default). packwire (its defaults: fetch cache on) serves the maintained repository; "+
			"git daemon serves a copy of the same synth history packed by `git gc --prune=now` (one pack, bitmap), and also the maintained files. "+
			"Before each round one commit (three files changed) is pushed into both repositories, so the fetch cache holds no answer: into the maintained one as a push through packwire lands (`receive.unpackLimit=1`: a small pack) followed by `packwire maintain` (what its scheduler does), into the gc copy followed by `git gc --prune=now`. Each clone of the first round is checked with `git fsck`. "+
			"Server CPU is the cgroup delta of each server's whole process tree. %d rounds after one warm-up, targets in a fresh random order; "+
			"ratios: median of per-round ratios with a 95%% bootstrap interval.", s.nRounds))
	r.table("| server | clone wall | server CPU |", "|---|---:|---:|")
	for _, t := range targets {
		r.row(t.name, secs(benchkit.Median(walls(got[t.name]))), ms(benchkit.Median(cpus(got[t.name]))))
	}
	r.note(fmt.Sprintf("packwire / git daemon on the gc layout: server CPU %s, wall %s. packwire / git daemon on the same maintained files: CPU %s. "+
		"git daemon, maintained / gc layout (the layout alone): CPU %s.", ratioCI(vsGC), ratioCI(wall), ratioCI(vsSame), ratioCI(layout)))
	r.target("cold full clone over git:// v2: server CPU <= 0.5x git daemon's on the git gc layout", vsGC.MedianRatio, 0.5, vsGC)
	r.note("Per-round server CPU (ms): " + perRound(targets, got))
}

func perRound(targets []target, got map[string][]sample) string {
	line := ""
	for _, t := range targets {
		line += t.name + ":"
		for _, x := range got[t.name] {
			line += " " + strconv.Itoa(int(x.cpu.Milliseconds()))
		}
		line += "; "
	}
	return line
}

// pushAsServed pushes HEAD of work to remote the way a push through
// packwire lands (gitexec.ServedConfig: receive.unpackLimit=1, a pack
// rather than loose objects), so a later clone reuses its objects as
// they are instead of compressing loose ones.
func (s *setup) pushAsServed(work, remote string) {
	s.mustGit(nil, work, "push", "-q", "--receive-pack=git -c receive.unpackLimit=1 receive-pack", remote, "HEAD")
}
