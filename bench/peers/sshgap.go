package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"packwire/bench/internal/benchkit"
	"packwire/internal/lab/compare"
	"packwire/internal/lab/netem"
)

// gapSample is one full clone: wall, the client's CPU (git and everything
// it waited for: ssh, index-pack; for file:// also upload-pack and
// pack-objects), the client's ssh process alone, and the server's CPU.
type gapSample struct {
	wall, client, ssh, server time.Duration
}

// sshGapWorkload measures the SSH full clone against `git clone --no-local
// file://` of the same files (issue 18's "SSH gap"): packwire as it runs by
// default (output paced), packwire with --ssh-max-unacked 0 (the client's
// whole window, as before), and OpenSSH sshd + git, all with the OpenSSH
// client's own cipher default.
func (s *setup) sshGapWorkload(r *report) {
	log.Print("SSH gap: full clone over SSH against file:// ...")
	port := benchkit.FreePort()
	// A copy of the data directory: a fetch cache belongs to one process,
	// and two servers replaying and storing the same responses in one
	// cache directory broke clones ("unexpected disconnect while reading
	// sideband packet").
	unpacedData := filepath.Join(s.out, "data-unpaced")
	benchkit.Run("cp", "-a", s.data, unpacedData)
	unpaced := benchkit.StartPackwire("packwire-unpaced", s.bin, unpacedData, filepath.Join(s.out, "packwire-unpaced.log"), port,
		"--maintain-interval", "0", "--git", "", "--http", "", "--ssh", "127.0.0.1:"+port, "--ssh-max-unacked", "0")
	defer unpaced.Stop()

	sshTime := filepath.Join(s.out, "ssh-time")
	sshEnv := []string{"GIT_SSH_COMMAND=/usr/bin/time -f '%U %S' -o " + sshTime + " " + benchkit.SSHCommand(s.key, "")}
	const (
		file     = "file://"
		paced    = "packwire SSH"
		noPacing = "packwire SSH --ssh-max-unacked 0"
		sshd     = "OpenSSH sshd + git"
	)
	targets := []target{
		{name: file, url: "file://" + filepath.Join(s.repos, s.repo+".git")},
		{name: paced, url: "ssh://bench@127.0.0.1:" + s.pwSSH + "/" + s.repo + ".git", env: sshEnv, server: s.packwire},
		{name: noPacing, url: "ssh://bench@127.0.0.1:" + port + "/" + s.repo + ".git", env: sshEnv, server: unpaced},
		{name: sshd, url: "ssh://" + benchkit.SSHDUser + "@127.0.0.1:" + s.sshd.Port + s.repos + "/" + s.repo + ".git", env: sshEnv, server: s.sshd},
	}
	dst := filepath.Join(s.out, "sshgap")
	got := map[string][]gapSample{}
	for round := -1; round < s.nRounds; round++ {
		for _, i := range rng.Perm(len(targets)) {
			t := targets[i]
			os.RemoveAll(dst)
			os.Remove(sshTime)
			var smp gapSample
			var cpu0 time.Duration
			if t.server != nil {
				cpu0 = t.server.Group.Read()
			}
			cmd := exec.Command("git", "clone", "-q", "--no-local", "--no-checkout", t.url, dst)
			cmd.Dir = s.out
			cmd.Env = append(append([]string{}, s.clientEnv...), t.env...)
			start := time.Now()
			if b, err := cmd.CombinedOutput(); err != nil {
				benchkit.Fatalf("%s: git clone: %v: %s", t.name, err, strings.TrimSpace(string(b)))
			}
			smp.wall = time.Since(start)
			// wait4's rusage covers git and the children it waited for.
			smp.client = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
			if t.server != nil {
				time.Sleep(100 * time.Millisecond) // git's children reaped and accounted
				smp.server = t.server.Group.Read() - cpu0
				smp.ssh = readTimeFile(sshTime)
			}
			if round >= 0 {
				got[t.name] = append(got[t.name], smp)
			}
			fmt.Fprintf(os.Stderr, "\rround %d/%d %-40s %7.3fs", round+1, s.nRounds, t.name, smp.wall.Seconds())
		}
	}
	fmt.Fprintln(os.Stderr)
	os.RemoveAll(dst)

	pick := func(name string, f func(gapSample) time.Duration) []time.Duration {
		var out []time.Duration
		for _, x := range got[name] {
			out = append(out, f(x))
		}
		return out
	}
	wall := func(x gapSample) time.Duration { return x.wall }
	r.section("SSH full clone against file:// (the SSH gap)", fmt.Sprintf("`git clone --no-local --no-checkout`, %d rounds after one warm-up, the 4 targets in a fresh random order each round, "+
		"the OpenSSH client with its default cipher (chacha20-poly1305 against both packwire and sshd). "+
		"Client CPU is git's rusage with every child it waited for (ssh, index-pack; for file:// also upload-pack and pack-objects, which are the server there); "+
		"client ssh is the OpenSSH client process alone (`/usr/bin/time`); server CPU is the server's cgroup. "+
		"Ratios are per round, median with a 95%% bootstrap interval. The unpaced packwire is a second `packwire serve` on a copy of the data directory with `--ssh-max-unacked 0`.", s.nRounds))
	r.table("| target | wall | / file:// (95% CI) | / sshd (95% CI) | client CPU | client ssh CPU | server CPU |",
		"|---|---:|---:|---:|---:|---:|---:|")
	fileWalls, sshdWalls := pick(file, wall), pick(sshd, wall)
	for _, t := range targets {
		w := pick(t.name, wall)
		vsFile, vsSSHD := "-", "-"
		if t.name != file {
			res := compare.Analyze(fileWalls, w)
			vsFile = ratioCI(res)
			if t.name == paced {
				r.target("full clone wall over SSH (packwire, paced) <= 1.25x file://", res.MedianRatio, 1.25, res)
			}
		}
		if t.name != sshd && t.name != file {
			vsSSHD = ratioCI(compare.Analyze(sshdWalls, w))
		}
		sshCPU, serverCPU := "-", "-"
		if t.server != nil {
			sshCPU = secs(benchkit.Median(pick(t.name, func(x gapSample) time.Duration { return x.ssh })))
			serverCPU = secs(benchkit.Median(pick(t.name, func(x gapSample) time.Duration { return x.server })))
		}
		r.row(t.name, secs(benchkit.Median(w)), vsFile, vsSSHD, secs(benchkit.Median(pick(t.name, func(x gapSample) time.Duration { return x.client }))), sshCPU, serverCPU)
	}
	pacing := compare.Analyze(pick(noPacing, wall), pick(paced, wall))
	sshCPU := compare.Analyze(pick(noPacing, func(x gapSample) time.Duration { return x.ssh }), pick(paced, func(x gapSample) time.Duration { return x.ssh }))
	r.note(fmt.Sprintf("Paced / unpaced packwire, same round: wall %s, client ssh CPU %s.", ratioCI(pacing), ratioCI(sshCPU)))

	if farRTT > 0 {
		s.farClone(r, targets[1], targets[2], sshEnv)
	}
}

// farRTT is the round trip of the far-client comparison (0: skipped).
var farRTT time.Duration

// farClone clones through a netem proxy that adds farRTT, paced against
// unpaced: pacing must not cost a far client throughput (its allowance
// grows with throughput x RTT to the client's whole window).
func (s *setup) farClone(r *report, paced, unpaced target, env []string) {
	log.Printf("SSH gap: far client (%v RTT), paced against unpaced ...", farRTT)
	var far []target
	for _, t := range []target{paced, unpaced} {
		upstream := strings.TrimPrefix(t.url, "ssh://bench@")
		upstream, _, _ = strings.Cut(upstream, "/")
		p := &netem.Proxy{Upstream: upstream, Delay: farRTT}
		addr, err := p.Start(context.Background())
		if err != nil {
			benchkit.Fatalf("netem: %v", err)
		}
		defer p.Close()
		far = append(far, target{name: t.name, url: "ssh://bench@" + addr + "/" + s.repo + ".git", env: env})
	}
	dst := filepath.Join(s.out, "sshgap-far")
	got := s.rounds(far, func(t target, _ int) sample {
		os.RemoveAll(dst)
		return sample{wall: s.mustGit(t.env, s.out, "clone", "-q", "--no-local", "--no-checkout", t.url, dst)}
	})
	os.RemoveAll(dst)
	res := compare.Analyze(walls(got[unpaced.name]), walls(got[paced.name]))
	r.note(fmt.Sprintf("Far client, through `internal/lab/netem` adding %v of round trip (unlimited rate), %d rounds: paced %s, unpaced %s, paced / unpaced %s.",
		farRTT, s.nRounds, secs(res.BMedian), secs(res.AMedian), ratioCI(res)))
}

// readTimeFile reads "USER SYS" seconds as /usr/bin/time -f '%U %S' wrote
// them; 0 when missing.
func readTimeFile(path string) time.Duration {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	var total time.Duration
	for _, f := range strings.Fields(string(b)) {
		if v, err := strconv.ParseFloat(f, 64); err == nil {
			total += time.Duration(v * float64(time.Second))
		}
	}
	return total
}
