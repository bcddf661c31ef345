// Command peers benchmarks packwire side by side with what users run today,
// on the same repositories, in the same run: git daemon (git://), nginx +
// fcgiwrap + git-http-backend (HTTP), OpenSSH sshd + git (SSH), and
// `git clone --no-local file://` as the no-network limit. Every server runs
// in its own cgroup (server CPU and memory of its whole process tree), A and
// B run in pairs in a shuffled order, and the ratios come with a 95%
// confidence interval from packwire's own `compare` statistics.
//
// Run as root from the repository root (cgroups; apt-get installs nginx,
// fcgiwrap and openssh-server when missing):
//
//	go run ./bench/peers -rounds 7 -results bench/RESULTS.md
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"packwire/bench/internal/benchkit"
	"packwire/internal/lab/synth"
)

// setup is everything the workloads share.
type setup struct {
	out   string // work directory
	bin   string // the packwire binary
	data  string // packwire's data directory; data/repos is the shared repos directory
	repos string // the bare repositories every server serves
	repo  string // name of the benchmark repository (without .git)
	// bundleCold: the bundle workload's packwire stores no fetch answers.
	bundleCold bool
	clientEnv  []string // isolated client environment
	key        string   // the client's SSH key (packwire user "bench" and sshd's root)
	token      string   // packwire HTTP token of user "bench" (pushes)
	nRounds    int

	packwire *benchkit.Server
	pwGit    string // packwire's ports
	pwHTTP   string
	pwSSH    string
	daemon   *benchkit.Server
	nginx    *benchkit.Server
	sshd     *benchkit.Server
	repoInfo string

	// ciOneFetch is the storm workload's median server CPU of one CI
	// runner's fetch, by variant ("SSH v2"): sshfloor's bound uses it.
	ciOneFetch map[string]time.Duration
	// coldOneClone is its median server CPU of one cold clone, by variant.
	coldOneClone map[string]time.Duration
}

// transport is one way to reach the repository, packwire's and the peer's.
type transport struct {
	name     string
	packwire func(repo string) string // URL for a repository name
	peer     func(repo string) string
	peerName string
	pwServer *benchkit.Server
	peerSrv  *benchkit.Server
	env      []string // client environment for both
}

func main() {
	rounds := flag.Int("rounds", 7, "pairs per comparison (after one warm-up each)")
	outDir := flag.String("out", "bench/out/peers", "work directory (repositories, data, clones)")
	shape := flag.String("shape", "jquery", "synth shape of the benchmark repository (jquery, swift, linux)")
	scale := flag.Float64("scale", 1, "synth scale of the benchmark repository")
	only := flag.String("only", "", "comma-separated workloads to run (clone, sshgap, noop, incremental, mirror, herd, storm, sshfloor, coldclone, bigstorm, idle, load, fastpath, splice, bundle, sshperf); default all but bigstorm, fastpath, splice, bundle and sshperf (sshperf wants a real history: -from); fastpath (which includes splice), splice and bundle run alone (their packwire stores no fetch answers)")
	bundleCold := flag.Bool("bundle-cold", false, "bundle: packwire stores no fetch answers, so git answers every fetch after the bundle (default: the fetch cache\nas deployed, the first clone after a push pays git, the next ones replay)")
	from := flag.String("from", "", "copy this bare repository (e.g. one packwire synth made, or a real history) instead of generating the shape (-shape names it)")
	flag.StringVar(from, "repo", "", "the same as -from")
	bigHerd := flag.Int("bigstorm-herd", 16, "clones per herd of the bigstorm workload (run it with a big repository: -shape linux -scale 0.15)")
	flag.StringVar(&stormParts, "storm-parts", "cold,repeated,ci", "comma-separated parts of the storm workload to run: cold (cold clone herds), repeated (repeated clones against the peers), ci (CI runners fetching after a push)")
	bigTransports := flag.String("bigstorm-transports", "git://,HTTP,SSH", "comma-separated transports of the bigstorm workload")
	results := flag.String("results", "", "write the results as Markdown to this file too (e.g. bench/RESULTS.md)")
	loadFor := flag.Duration("load-duration", 60*time.Second, "duration of the 64-clone load with a pusher")
	idleConns := flag.Int("idle", 1000, "idle connections held per transport")
	flag.DurationVar(&farRTT, "sshgap-rtt", 100*time.Millisecond, "round trip of sshgap's far-client comparison, paced against unpaced (0: skip it)")
	sshFloorN := flag.Int("sshfloor-n", 16, "connections per measurement of the sshfloor workload (one after another, then at once)")
	bareServe := flag.String("bare-ssh-serve", "", "internal (sshfloor): serve the bare x/crypto/ssh server on this address")
	bareReply := flag.String("bare-ssh-reply", "", "internal (sshfloor): the bare server's answer to every exec")
	bareKey := flag.String("bare-ssh-key", "", "internal (sshfloor): the public key the bare server accepts")
	flag.Parse()
	log.SetFlags(log.Ltime)
	if *bareServe != "" {
		serveBareSSH(*bareServe, *bareReply, *bareKey)
		return
	}
	benchkit.StopOnSignal()
	if os.Geteuid() != 0 {
		log.Fatal("peers needs root: cgroups per server, sshd, and apt-get for missing peers")
	}
	benchkit.EnsureTools(map[string]string{"nginx": "nginx", "fcgiwrap": "fcgiwrap", "sshd": "openssh-server", "ssh": "openssh-client"})

	out, _ := filepath.Abs(*outDir)
	os.RemoveAll(out)
	if err := os.MkdirAll(out, 0o755); err != nil {
		log.Fatal(err)
	}
	s := &setup{out: out, nRounds: *rounds, repo: *shape, bundleCold: *bundleCold, ciOneFetch: map[string]time.Duration{}, coldOneClone: map[string]time.Duration{}}
	want := map[string]bool{}
	for _, w := range strings.Split(*only, ",") {
		if w != "" {
			want[w] = true
		}
	}
	// bigstorm needs a big repository and an hour, sshperf a real history
	// (-from): only when asked for.
	run := func(name string) bool {
		return want[name] || len(want) == 0 && name != "bigstorm" && name != "fastpath" && name != "sshperf" && name != "bundle"
	}
	if (want["fastpath"] || want["bundle"]) && len(want) > 1 {
		log.Fatal("-only fastpath and -only bundle run alone: their packwire stores no fetch answers, which other workloads measure")
	}

	home := filepath.Join(out, "home")
	os.MkdirAll(home, 0o700)
	s.clientEnv = []string{"HOME=" + home, "PATH=" + os.Getenv("PATH"), "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0", "LC_ALL=C"}
	s.bin = filepath.Join(out, "packwire")
	benchkit.Run("go", "build", "-o", s.bin, "./cmd/packwire")
	s.data = filepath.Join(out, "data")
	s.repos = filepath.Join(s.data, "repos")
	// Admin commands (maintain, user add) need a data directory that
	// exists: made as serve makes it.
	benchkit.Run(s.bin, "init", "--data", s.data)
	os.MkdirAll(s.repos, 0o755)

	// The benchmark repository: a synthetic one of the study's shapes, put
	// into the layout packwire's maintenance keeps (every server serves the
	// same files, so the layout helps all of them alike).
	dst := filepath.Join(s.repos, s.repo+".git")
	var counts string
	if *from != "" {
		log.Printf("copying %s ...", *from)
		benchkit.Run("cp", "-a", *from, dst)
		counts = fmt.Sprintf("copied from %s (%d objects)", *from, benchkit.CountObjects(dst))
	} else {
		log.Printf("making a %s-shaped repository at scale %g ...", *shape, *scale)
		res, err := synth.Generate(context.Background(), synth.Options{Shape: *shape, Scale: *scale, Out: dst, Seed: 1})
		if err != nil {
			log.Fatal(err)
		}
		counts = fmt.Sprintf("%d commits, %d trees, %d blobs, %d branches, %d tags", res.Commits, res.Trees, res.Blobs, res.Branches, res.Tags)
	}
	// coldclone's peer serves the same history in git's own layout.
	if run("coldclone") || run("fastpath") || run("splice") || run("bundle") {
		gcDst := filepath.Join(s.repos, s.gcCopy()+".git")
		benchkit.Run("cp", "-a", dst, gcDst)
		benchkit.Run("git", "-C", gcDst, "gc", "--quiet", "--prune=now")
	}
	benchkit.Run(s.bin, "init", "--data", s.data) // admin commands refuse a directory without a store
	if run("fastpath") || run("splice") || run("bundle") {
		// The fast path (and the clone bundle) needs the preferred pack with its tips recorded:
		// a copy maintained by an older packwire has them not.
		benchkit.Run(s.bin, "maintain", "--data", s.data, "--full", s.repo)
	} else {
		benchkit.Run(s.bin, "maintain", "--data", s.data, s.repo)
	}
	s.repoInfo = fmt.Sprintf("%s-shaped synth repository at scale %g: %s, pack %.1f MiB",
		*shape, *scale, counts, float64(benchkit.DirSize(filepath.Join(dst, "objects", "pack")))/(1<<20))
	log.Print(s.repoInfo)

	s.key = filepath.Join(home, "id_ed25519")
	benchkit.Run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", s.key)
	benchkit.Run(s.bin, "user", "add", "bench", "--key", s.key+".pub", "--data", s.data)
	benchkit.Run(s.bin, "grant", "bench", "write", "**", "--data", s.data)
	tokenOut := strings.Fields(benchkit.Output(s.bin, "token", "create", "bench", "--data", s.data))
	s.token = tokenOut[len(tokenOut)-1]
	pub, _ := os.ReadFile(s.key + ".pub")

	s.pwGit, s.pwHTTP, s.pwSSH = benchkit.FreePort(), benchkit.FreePort(), benchkit.FreePort()
	// Defaults, except: no background maintenance (the layout must not
	// change between A and B) and connection limits high enough for the
	// idle-connection workload.
	serveArgs := []string{"--maintain-interval", "0", "--max-connections", "5000",
		"--git", "127.0.0.1:" + s.pwGit, "--http", "127.0.0.1:" + s.pwHTTP, "--ssh", "127.0.0.1:" + s.pwSSH}
	if run("fastpath") || run("splice") || run("bundle") && *bundleCold {
		// Every clone cold: runs are shared, no answer is stored.
		serveArgs = append(serveArgs, "--fetch-cache-max-bytes", "0")
	}
	s.packwire = benchkit.StartPackwire("packwire", s.bin, s.data, filepath.Join(out, "packwire.log"), s.pwGit, serveArgs...)
	benchkit.WaitPort(s.pwHTTP)
	benchkit.WaitPort(s.pwSSH)
	s.daemon = benchkit.StartGitDaemon("git-daemon", s.repos, s.clientEnv)
	s.nginx = benchkit.StartNginx("nginx", filepath.Join(out, "nginx"), s.repos)
	s.sshd = benchkit.StartSSHD("sshd", filepath.Join(out, "sshd"), string(pub))
	defer func() {
		for _, srv := range []*benchkit.Server{s.packwire, s.daemon, s.nginx, s.sshd} {
			srv.Stop()
		}
	}()

	r := &report{}
	r.header(s)
	// Each workload's figures are written as soon as it ends: a long run
	// stopped later keeps what it measured.
	partial := func() {
		if *results != "" {
			if err := os.WriteFile(*results, []byte(r.String()), 0o644); err != nil {
				benchkit.Fatalf("%v", err)
			}
		}
	}
	if run("clone") {
		s.cloneWorkload(r)
		partial()
	}
	if run("sshgap") {
		s.sshGapWorkload(r)
		partial()
	}
	if run("noop") {
		s.noopWorkload(r)
		partial()
	}
	if run("incremental") {
		s.incrementalWorkload(r)
		partial()
	}
	if run("mirror") {
		s.mirrorWorkload(r)
		partial()
	}
	if run("herd") {
		s.herdWorkload(r)
		partial()
	}
	if run("storm") {
		s.stormWorkload(r)
		partial()
	}
	if run("sshfloor") {
		s.sshFloorWorkload(r, *sshFloorN)
		partial()
	}
	if run("coldclone") {
		s.coldCloneWorkload(r)
		partial()
	}
	if run("fastpath") {
		s.fastPathWorkload(r)
		partial()
	}
	if run("fastpath") || run("splice") {
		s.spliceWorkload(r) // after the fast path: its pushes end it
		partial()
	}
	if run("bundle") {
		s.bundleWorkload(r)
		partial()
	}
	if run("sshperf") {
		s.sshPerfWorkload(r)
	}
	if run("bigstorm") {
		trs := map[string]bool{}
		for _, t := range strings.Split(*bigTransports, ",") {
			trs[t] = true
		}
		s.bigStormWorkload(r, *bigHerd, trs)
		partial()
	}
	if run("idle") {
		s.idleWorkload(r, *idleConns)
		partial()
	}
	if run("load") {
		s.loadWorkload(r, *loadFor)
		partial()
	}
	fmt.Print(r.String())
	if *results != "" {
		if err := os.WriteFile(*results, []byte(r.String()), 0o644); err != nil {
			benchkit.Fatalf("%v", err)
		}
		log.Printf("wrote %s", *results)
	}
}

// transports lists the three comparisons with their URLs.
func (s *setup) transports() []transport {
	ssh := []string{"GIT_SSH_COMMAND=" + benchkit.SSHCommand(s.key, "")}
	return []transport{
		{name: "git://", peerName: "git daemon",
			packwire: func(r string) string { return "git://127.0.0.1:" + s.pwGit + "/" + r + ".git" },
			peer:     func(r string) string { return "git://127.0.0.1:" + s.daemon.Port + "/" + r + ".git" },
			pwServer: s.packwire, peerSrv: s.daemon},
		{name: "HTTP", peerName: "nginx + git-http-backend",
			packwire: func(r string) string { return "http://127.0.0.1:" + s.pwHTTP + "/" + r + ".git" },
			peer:     func(r string) string { return "http://127.0.0.1:" + s.nginx.Port + "/" + r + ".git" },
			pwServer: s.packwire, peerSrv: s.nginx},
		{name: "SSH", peerName: "OpenSSH sshd + git",
			packwire: func(r string) string { return "ssh://bench@127.0.0.1:" + s.pwSSH + "/" + r + ".git" },
			peer: func(r string) string {
				return "ssh://" + benchkit.SSHDUser + "@127.0.0.1:" + s.sshd.Port + s.repos + "/" + r + ".git"
			},
			pwServer: s.packwire, peerSrv: s.sshd, env: ssh},
	}
}

// pushURL adds the bench user's token to an http:// URL of packwire's:
// packwire lets anonymous users read but not push.
func (s *setup) pushURL(url string) string {
	if rest, ok := strings.CutPrefix(url, "http://"); ok {
		return "http://bench:" + s.token + "@" + rest
	}
	return url
}

// git runs one git command in the client environment and returns its wall time.
func (s *setup) git(env []string, dir string, args ...string) (time.Duration, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(append([]string{}, s.clientEnv...), env...)
	start := time.Now()
	b, err := cmd.CombinedOutput()
	if err != nil {
		return time.Since(start), fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(b)))
	}
	return time.Since(start), nil
}

func (s *setup) mustGit(env []string, dir string, args ...string) time.Duration {
	d, err := s.git(env, dir, args...)
	if err != nil {
		benchkit.Fatalf("%v", err)
	}
	return d
}

func machine() string {
	gitVersion := strings.TrimSpace(benchkit.Output("git", "--version"))
	sshVersion := strings.TrimSpace(benchkit.Output("ssh", "-V"))
	ngx := strings.TrimSpace(strings.TrimPrefix(benchkit.Output("nginx", "-v"), "nginx version: "))
	return fmt.Sprintf("%d CPUs, Linux, %s, %s, %s, %s", runtime.NumCPU(), gitVersion, sshVersion, ngx, runtime.Version())
}
