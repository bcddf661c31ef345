package main

import (
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"packwire/bench/internal/benchkit"
	"packwire/internal/lab/compare"
)

// fastPathTargets are packwire over every transport, then its peer, git
// daemon on the gc copy (last).
func (s *setup) fastPathTargets() []target {
	v0 := []string{"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=protocol.version", "GIT_CONFIG_VALUE_0=0"}
	ssh := "GIT_SSH_COMMAND=" + benchkit.SSHCommand(s.key, "")
	pw := func(scheme, port string) string { return scheme + "127.0.0.1:" + port + "/" + s.repo + ".git" }
	targets := []target{
		{name: "packwire git:// v2", url: pw("git://", s.pwGit), server: s.packwire},
		{name: "packwire HTTP v2", url: pw("http://", s.pwHTTP), server: s.packwire},
		{name: "packwire HTTP v0", url: pw("http://", s.pwHTTP), env: v0, server: s.packwire},
		{name: "packwire SSH v2", url: pw("ssh://bench@", s.pwSSH), env: []string{ssh}, server: s.packwire},
		{name: "git daemon, git gc layout", url: "git://127.0.0.1:" + s.daemon.Port + "/" + s.gcCopy() + ".git", server: s.daemon},
	}
	return targets
}

// fastPathWorkload is issue 32 part 1: a cold full clone of a maintained
// repository answered from its preferred pack (internal/clonepack), over
// every transport, against git daemon serving the same history in git's
// own gc layout. Cold: packwire runs with --fetch-cache-max-bytes 0 for
// this workload (main), so no answer is ever stored and every clone leads
// (the fast path, or git); nothing is pushed, so the preferred pack stays
// the closure of the tips. Each target's first clone is checked with git
// fsck and its object count against the gc copy's.
func (s *setup) fastPathWorkload(r *report) {
	log.Print("cold full clone from the preferred pack: packwire against git daemon (git gc layout) ...")
	gcBare := filepath.Join(s.repos, s.gcCopy()+".git")
	targets := s.fastPathTargets()
	peer := targets[len(targets)-1].name
	count := strings.TrimSpace(benchkit.Output("git", "-C", gcBare, "rev-list", "--objects", "--count", "--branches", "--tags", "HEAD"))
	want, err := strconv.Atoi(count)
	if err != nil {
		benchkit.Fatalf("counting the default clone's objects: %q", count)
	}
	dst := filepath.Join(s.out, "fastpath")
	checked := map[string]bool{}
	got := s.rounds(targets, func(t target, round int) sample {
		os.RemoveAll(dst)
		smp := measure(t.server, func() time.Duration {
			return s.mustGit(t.env, s.out, "clone", "-q", "--bare", t.url, dst)
		})
		if !checked[t.name] {
			checked[t.name] = true
			s.mustGit(nil, dst, "fsck", "--full", "--no-progress", "--no-dangling")
			if n := benchkit.CountObjects(dst); n != want {
				benchkit.Fatalf("%s: the clone has %d objects, the gc copy %d", t.name, n, want)
			}
		}
		return smp
	})
	os.RemoveAll(dst)
	// How many of packwire's clones the fast path answered, from its
	// governor's records (pack_cache "clone-pack-file").
	time.Sleep(settle)
	clones := (len(targets) - 1) * (s.nRounds + 1)
	records := benchkit.Output(s.bin, "governor", "--data", s.data, "--last", strconv.Itoa(4*clones), "--json")
	fast := strings.Count(records, `"pack_cache":"clone-pack-file"`)

	r.section("Cold full clone from the preferred pack (issue 32 part 1)", fmt.Sprintf(
		"`git clone --bare` of the maintained repository: packwire (fetch cache storing nothing, `--fetch-cache-max-bytes 0`, so every clone is cold and "+
			"is answered from the preferred pack with no git) over git:// v2, HTTP v2 and v0 and SSH v2, against git daemon serving a copy of the same "+
			"history packed by `git gc --prune=now` (one pack, bitmap; its pack-objects reuses that pack). Each target's first clone is checked with "+
			"`git fsck --full` and its object count against the gc copy's (%d objects). Server CPU is the cgroup delta of each server's whole process tree. "+
			"%d rounds after one warm-up, targets in a fresh random order; ratios: median of per-round ratios with a 95%% bootstrap interval.", want, s.nRounds))
	r.table("| server | clone wall | server CPU |", "|---|---:|---:|")
	for _, t := range targets {
		r.row(t.name, secs(benchkit.Median(walls(got[t.name]))), ms(benchkit.Median(cpus(got[t.name]))))
	}
	for _, t := range targets[:len(targets)-1] {
		vs := compare.Analyze(cpus(got[peer]), cpus(got[t.name]))
		r.target(t.name+" cold full clone: server CPU <= 0.1x git daemon's on the git gc layout", vs.MedianRatio, 0.1, vs)
	}
	r.note(fmt.Sprintf("packwire's governor recorded %d of its %d clones (warm-up included) as answered from the preferred pack (`clone-pack-file`).", fast, clones))
	r.note("Per-round server CPU (ms): " + perRound(targets, got))
}

// spliceWorkload is issue 32 part 2: the first full clone after a push,
// answered with the preferred pack spliced with a thin pack of what the
// push added. Before each round one commit is pushed into the maintained
// repository (no maintenance after it: the preferred pack stays as it
// was, so the pushes accumulate, one more commit each round) and into
// the gc copy, which is then repacked by `git gc` as git's own layout
// after a push. packwire stores no answers (see fastPathWorkload), so
// every one of its clones is a first clone after the push.
func (s *setup) spliceWorkload(r *report) {
	log.Print("first full clone after a push (splice): packwire against git daemon (git gc layout) ...")
	bare := filepath.Join(s.repos, s.repo+".git")
	gcBare := filepath.Join(s.repos, s.gcCopy()+".git")
	work := filepath.Join(s.out, "splice-work")
	s.mustGit(nil, s.out, "clone", "-q", "--no-checkout", bare, work)
	s.mustGit(nil, work, "checkout", "-q", "HEAD")
	s.mustGit(nil, work, "remote", "add", "gc", gcBare)
	defer os.RemoveAll(work)
	targets := s.fastPathTargets()
	peer := targets[len(targets)-1].name
	dst := filepath.Join(s.out, "splice")
	pushed := -2
	checked := map[string]bool{}
	got := s.rounds(targets, func(t target, round int) sample {
		if round != pushed {
			pushed = round
			s.smallCommit(work, fmt.Sprintf("splice %d", round))
			s.pushAsServed(work, "origin")
			s.mustGit(nil, work, "push", "-q", "gc", "HEAD")
			benchkit.Run("git", "-C", gcBare, "gc", "--quiet", "--prune=now")
			time.Sleep(2 * time.Second) // older than repostate.RacyWindow, as a real clone after a push
		}
		os.RemoveAll(dst)
		smp := measure(t.server, func() time.Duration {
			return s.mustGit(t.env, s.out, "clone", "-q", "--bare", t.url, dst)
		})
		if !checked[t.name] {
			checked[t.name] = true
			s.mustGit(nil, dst, "fsck", "--full", "--no-progress", "--no-dangling")
		}
		return smp
	})
	os.RemoveAll(dst)
	time.Sleep(settle)
	clones := (len(targets) - 1) * (s.nRounds + 1)
	records := benchkit.Output(s.bin, "governor", "--data", s.data, "--last", strconv.Itoa(4*clones), "--json")
	spliced := strings.Count(records, `"pack_cache":"clone-splice"`)

	r.section("First full clone after a push, spliced (issue 32 part 2)", fmt.Sprintf(
		"`git clone --bare` of the maintained repository after a push: before each round one commit (three files changed) is pushed into it (as a push "+
			"through packwire lands, a small pack; no maintenance, so the preferred pack stays and the pushes accumulate) and into the gc copy, then "+
			"`git gc --prune=now` there. packwire (storing no fetch answers) answers with the preferred pack's entries and a thin pack of the pushes "+
			"(`git pack-objects --thin`; the old tips proved still wanted from the wants and the thin pack's commits, `git rev-list` only for what is left; "+
			"a SHA-1 over the whole stream). Each target's first clone is checked "+
			"with `git fsck --full`. Server CPU is the cgroup delta of each server's whole process tree. %d rounds after one warm-up, targets in a fresh "+
			"random order; ratios: median of per-round ratios with a 95%% bootstrap interval.", s.nRounds))
	r.table("| server | clone wall | server CPU |", "|---|---:|---:|")
	for _, t := range targets {
		r.row(t.name, secs(benchkit.Median(walls(got[t.name]))), ms(benchkit.Median(cpus(got[t.name]))))
	}
	for _, t := range targets[:len(targets)-1] {
		vs := compare.Analyze(cpus(got[peer]), cpus(got[t.name]))
		r.target(t.name+" first full clone after a push: server CPU <= 0.2x git daemon's cold clone on the git gc layout", vs.MedianRatio, 0.2, vs)
	}
	r.note(fmt.Sprintf("packwire's governor recorded %d of its %d clones (warm-up included) as spliced (`clone-splice`).", spliced, clones))
	r.note("Per-round server CPU (ms): " + perRound(targets, got))
}
