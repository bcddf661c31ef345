package main

import (
	"fmt"
	"log"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"packwire/bench/internal/benchkit"
	"packwire/internal/lab/compare"
)

// sshPerfWorkload measures SSH's data path (issue 32 part 3): what a
// repeated full clone over SSH (replayed from the fetch cache: no git
// runs) costs packwire's server, against
//   - the bare x/crypto/ssh server (serveBareSSH) sending the same pack
//     with the same cipher into `git index-pack --stdin`, the reader git
//     clone runs, so that the client returns window at the same pace;
//   - the same, into /dev/null (a reader that never waits);
//   - OpenSSH sshd + git, the client with its default ciphers;
//
// and the clone's wall against `git clone --no-local file://`. Each round
// runs every target once, in a fresh random order; ratios are medians of
// the per-round pairs.
func (s *setup) sshPerfWorkload(r *report) {
	log.Printf("sshperf: SSH's data path ...")
	sshCmd := benchkit.SSHCommand(s.key, "")
	env := []string{"GIT_SSH_COMMAND=" + sshCmd}
	pwURL := "ssh://bench@127.0.0.1:" + s.pwSSH + "/" + s.repo + ".git"
	sshdURL := "ssh://" + benchkit.SSHDUser + "@127.0.0.1:" + s.sshd.Port + s.repos + "/" + s.repo + ".git"
	fileURL := "file://" + filepath.Join(s.repos, s.repo+".git")
	work := filepath.Join(s.out, "sshperf")
	os.MkdirAll(work, 0o755)

	// The first clone fills the fetch cache; its pack is what every
	// repeated clone receives, and what the bare server sends.
	ref := filepath.Join(work, "ref.git")
	s.mustGit(env, "", "clone", "-q", "--bare", pwURL, ref)
	packs, _ := filepath.Glob(filepath.Join(ref, "objects", "pack", "*.pack"))
	if len(packs) != 1 {
		benchkit.Fatalf("sshperf: the clone has %d packs", len(packs))
	}
	pack := packs[0]
	st, _ := os.Stat(pack)
	cipher := negotiated(strings.Fields(sshCmd)[1:], s.pwSSH, "bench")
	flush := filepath.Join(work, "flush.pkt")
	os.WriteFile(flush, []byte("0000"), 0o644)
	barePort, bare, stop := s.startBareSSH(flush)
	defer stop()
	bareArgs := append(strings.Fields(benchkit.SSHCommand(s.key, cipher))[1:], "-p", barePort, "git@127.0.0.1", "cat "+pack)

	clone := func(url string) func() error {
		return func() error {
			dst := filepath.Join(work, "clone.git")
			os.RemoveAll(dst)
			_, err := s.git(env, "", "clone", "-q", "--bare", "--no-local", url, dst)
			return err
		}
	}
	// bareInto runs the OpenSSH client against the bare server, its
	// output into index-pack (a fresh repository) or /dev/null.
	bareInto := func(indexPack bool) func() error {
		return func() error {
			dst := filepath.Join(work, "index.git")
			os.RemoveAll(dst)
			if _, err := s.git(nil, "", "init", "-q", "--bare", dst); err != nil {
				return err
			}
			in, err := os.Open(flush)
			if err != nil {
				return err
			}
			defer in.Close()
			sshc := exec.Command("ssh", bareArgs...)
			sshc.Stdin = in
			sshc.Env = s.clientEnv
			if !indexPack {
				return sshc.Run() // stdout nil: /dev/null
			}
			ip := exec.Command("git", "-C", dst, "index-pack", "--stdin")
			ip.Env = s.clientEnv
			if ip.Stdin, err = sshc.StdoutPipe(); err != nil {
				return err
			}
			if err := ip.Start(); err != nil {
				return err
			}
			serr := sshc.Run()
			if err := ip.Wait(); err != nil {
				return fmt.Errorf("index-pack: %v", err)
			}
			return serr
		}
	}
	type target struct {
		name       string
		group      *benchkit.Group // nil: no server (file://)
		run        func() error
		cpu, walls []time.Duration
		errs       int
	}
	targets := []*target{
		{name: "packwire SSH, repeated clone", group: s.packwire.Group, run: clone(pwURL)},
		{name: "bare x/crypto/ssh, the pack into index-pack", group: bare, run: bareInto(true)},
		{name: "bare x/crypto/ssh, the pack into /dev/null", group: bare, run: bareInto(false)},
		{name: "OpenSSH sshd + git, clone", group: s.sshd.Group, run: clone(sshdURL)},
		{name: "file:// clone (--no-local)", run: clone(fileURL)},
	}
	for round := 0; round <= s.nRounds; round++ { // round 0 warms up
		for _, i := range mrand.Perm(len(targets)) {
			t := targets[i]
			var cpu0 time.Duration
			if t.group != nil {
				cpu0 = t.group.Read()
			}
			start := time.Now()
			err := t.run()
			wall := time.Since(start)
			var cpu time.Duration
			if t.group != nil {
				cpu = t.group.Read() - cpu0
			}
			if err != nil {
				t.errs++
				log.Printf("sshperf: %s: %v", t.name, err)
				continue
			}
			if round > 0 {
				t.cpu, t.walls = append(t.cpu, cpu), append(t.walls, wall)
			}
			fmt.Fprintf(os.Stderr, "\rsshperf round %d/%d %-46s cpu %6.1f ms wall %5.2f s   ", round, s.nRounds, t.name, msf(cpu), wall.Seconds())
		}
	}
	fmt.Fprintln(os.Stderr)
	load, _ := os.ReadFile("/proc/loadavg")

	r.section("SSH's data path: a repeated full clone against the bare library streaming the same pack",
		fmt.Sprintf("A full clone (`git clone --bare --no-local`, protocol v2) over SSH that packwire replays from its fetch cache (no git runs), the OpenSSH client with its default ciphers (packwire negotiated %s with it). "+
			"The bare server is golang.org/x/crypto/ssh alone (bench/peers re-executed in its own cgroup) sending the %.1f MiB pack that clone received, with the same cipher (`ssh -c %s`), into `git index-pack --stdin` (the reader git clone runs, so the client returns window at a clone's pace) and into /dev/null (a reader that never waits). "+
			"Server CPU is each server's cgroup; %d rounds after a warm-up, targets in a fresh random order each round; medians, ratios the median of per-round pairs with a 95%% bootstrap interval. Load average at the end: %s.",
			cipher, float64(st.Size())/(1<<20), cipher, s.nRounds, strings.Join(strings.Fields(string(load))[:3], " ")))
	r.table("| target | server CPU | wall | errors |", "|---|---:|---:|---:|")
	for _, t := range targets {
		cpu := "-"
		if t.group != nil {
			cpu = ms(benchkit.Median(t.cpu))
		}
		r.row(t.name, cpu, secs(benchkit.Median(t.walls)), fmt.Sprint(t.errs))
	}
	pw, ip, devnull, sshd, file := targets[0], targets[1], targets[2], targets[3], targets[4]
	vsIP := compare.Analyze(ip.cpu, pw.cpu) // ratios B/A: packwire / peer
	vsNull := compare.Analyze(devnull.cpu, pw.cpu)
	vsSSHD := compare.Analyze(sshd.cpu, pw.cpu)
	vsFile := compare.Analyze(file.walls, pw.walls)
	r.note(fmt.Sprintf("packwire / bare into index-pack: %s; / bare into /dev/null: %s; / sshd + git: %s; clone wall / file://: %s.",
		ratioCI(vsIP), ratioCI(vsNull), ratioCI(vsSSHD), ratioCI(vsFile)))
	r.target("repeated full clone over SSH: server CPU <= 1.3x the bare x/crypto/ssh server sending the pack into index-pack", vsIP.MedianRatio, 1.3, vsIP)
	r.target("repeated full clone over SSH: server CPU <= 1.3x the bare x/crypto/ssh server sending the pack into /dev/null", vsNull.MedianRatio, 1.3, vsNull)
	r.target("repeated full clone over SSH: server CPU <= 0.15x OpenSSH sshd + git", vsSSHD.MedianRatio, 0.15, vsSSHD)
	r.target("SSH full clone wall <= 1.1x file://", vsFile.MedianRatio, 1.1, vsFile)
}

// negotiated is the cipher the OpenSSH client (sshArgs, without the
// program) chooses against the SSH server on port as user.
func negotiated(sshArgs []string, port, user string) string {
	var args []string
	for _, a := range sshArgs {
		if strings.HasPrefix(a, "LogLevel=") {
			a = "LogLevel=DEBUG1" // ssh takes an option's first value
		}
		args = append(args, a)
	}
	args = append(args, "-p", port, user+"@127.0.0.1", "git-upload-pack", "/x.git")
	cmd := exec.Command("ssh", args...)
	cmd.Stdin = strings.NewReader("0000")
	out, _ := cmd.CombinedOutput()
	for _, l := range strings.Split(string(out), "\n") {
		if _, after, ok := strings.Cut(l, "kex: server->client cipher: "); ok {
			return strings.Fields(after)[0]
		}
	}
	benchkit.Fatalf("sshperf: no cipher in ssh's log:\n%s", out)
	return ""
}
