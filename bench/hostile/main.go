// Command hostile measures what attacks on a public Git server cost the
// honest clients and the server (issue 30): for each attack, 8 honest clone
// loops and 2 honest pushers run alone (baseline), then with the attack
// running from another address, then the attack runs alone while the
// server's CPU is measured. It reports the honest clients' errors and
// median clone wall against the baseline, lost pushes (every acknowledged
// push made a branch of its own; all are checked at the end) and the
// server's CPU during the attack alone.
//
// Run as root from the repository root (the server runs in its own cgroup):
//
//	go run ./bench/hostile -duration 20s -results bench/HOSTILE.md
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"packwire/bench/internal/benchkit"
	"packwire/internal/lab/synth"
)

// env is what the honest clients and the attacks share.
type env struct {
	out       string
	bin       string
	data      string
	clientEnv []string
	sshEnv    []string // clientEnv with GIT_SSH_COMMAND for the honest key
	key       string   // honest user's SSH key
	eveKey    string   // the attacker's SSH key (a valid user with write on eve/**)
	token     string   // honest user's token
	eveToken  string   // attacker's token
	server    *benchkit.Server
	git       string // listener ports
	http      string
	ssh       string
	attacker  string       // the attacks' source address
	resets    atomic.Int64 // the attacker's dials reset by the server, this phase
	serveArgs []string
}

func main() {
	duration := flag.Duration("duration", 20*time.Second, "length of each phase (baseline, under attack, attack alone)")
	only := flag.String("attacks", "", "comma-separated attacks to run (default all): "+strings.Join(attackNames(), ", "))
	outDir := flag.String("out", "bench/out/hostile", "work directory")
	scale := flag.Float64("scale", 0.1, "synth scale of the jquery-shaped benchmark repository")
	results := flag.String("results", "", "write the results as Markdown to this file too (e.g. bench/HOSTILE.md)")
	flag.Parse()
	log.SetFlags(log.Ltime)
	benchkit.StopOnSignal()
	if os.Geteuid() != 0 {
		log.Fatal("hostile needs root: the server's CPU is read from its own cgroup")
	}
	e := setup(*outDir, *scale)
	defer func() { e.server.Stop() }()

	want := map[string]bool{}
	for _, a := range strings.Split(*only, ",") {
		if a = strings.TrimSpace(a); a != "" {
			want[a] = true
		}
	}
	var rows []row
	for _, a := range attacks() {
		if len(want) > 0 && !want[a.name] {
			continue
		}
		log.Printf("== %s: %s", a.name, a.what)
		rows = append(rows, e.measure(a, *duration))
	}
	lost := e.checkPushes()
	md := report(e, *scale, *duration, rows, lost)
	fmt.Print(md)
	if *results != "" {
		if err := os.WriteFile(*results, []byte(md), 0o644); err != nil {
			log.Fatal(err)
		}
		log.Printf("wrote %s", *results)
	}
}

// setup builds packwire, makes the benchmark repository, the honest user
// (write on team/*) and the attacker eve (write on eve/* only), and starts
// the server in its own cgroup with the limits the attacks were
// run against.
func setup(outDir string, scale float64) *env {
	out, _ := filepath.Abs(outDir)
	os.RemoveAll(out)
	os.MkdirAll(out, 0o755)
	home := filepath.Join(out, "home")
	os.MkdirAll(home, 0o700)
	e := &env{out: out, attacker: "127.0.0.2"}
	e.clientEnv = []string{"HOME=" + home, "PATH=" + os.Getenv("PATH"), "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0", "LC_ALL=C"}
	e.bin = filepath.Join(out, "packwire")
	benchkit.Run("go", "build", "-o", e.bin, "./cmd/packwire")
	e.data = filepath.Join(out, "data")
	benchkit.Run(e.bin, "init", "--data", e.data)
	repos := filepath.Join(e.data, "repos")
	dst := filepath.Join(repos, "team", "app.git")
	os.MkdirAll(filepath.Dir(dst), 0o755)
	log.Printf("making a jquery-shaped repository at scale %g ...", scale)
	if _, err := synth.Generate(context.Background(), synth.Options{Shape: "jquery", Scale: scale, Out: dst, Seed: 1}); err != nil {
		log.Fatal(err)
	}
	benchkit.Run(e.bin, "maintain", "--data", e.data, "team/app")
	benchkit.Run(e.bin, "repo", "create", "eve/pet", "--data", e.data)

	e.key = filepath.Join(home, "id_ed25519")
	e.eveKey = filepath.Join(home, "eve_ed25519")
	for _, k := range []string{e.key, e.eveKey} {
		benchkit.Run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", k)
	}
	benchkit.Run(e.bin, "user", "add", "honest", "--key", e.key+".pub", "--data", e.data)
	benchkit.Run(e.bin, "grant", "honest", "write", "team/*", "--data", e.data)
	benchkit.Run(e.bin, "user", "add", "eve", "--key", e.eveKey+".pub", "--data", e.data)
	benchkit.Run(e.bin, "grant", "eve", "write", "eve/*", "--data", e.data)
	e.token = lastField(benchkit.Output(e.bin, "token", "create", "honest", "--data", e.data))
	e.eveToken = lastField(benchkit.Output(e.bin, "token", "create", "eve", "--data", e.data))
	e.sshEnv = append(append([]string{}, e.clientEnv...), "GIT_SSH_COMMAND="+benchkit.SSHCommand(e.key, ""))

	e.git, e.http, e.ssh = benchkit.FreePort(), benchkit.FreePort(), benchkit.FreePort()
	// The limits the attacks of issue 30 were run against; the rest are
	// packwire's defaults. No background maintenance: the layout must not
	// change between phases.
	e.serveArgs = []string{"--maintain-interval", "0", "--max-connections", "100", "--request-timeout", "20s",
		"--git", "127.0.0.1:" + e.git, "--http", "127.0.0.1:" + e.http, "--ssh", "127.0.0.1:" + e.ssh}
	// The attacks dial from 127.0.0.2 to these 127.0.0.1 listeners (any
	// loopback source reaches them on Linux).
	return e
}

// start runs a server of its own for one attack, so that nothing an
// earlier attack left running (a runaway git, a held slot) counts against
// the next one.
func (e *env) start(name string) {
	e.server.Stop()
	e.server = benchkit.StartPackwire("packwire-"+name, e.bin, e.data, filepath.Join(e.out, "packwire-"+name+".log"), e.git, e.serveArgs...)
	benchkit.WaitPort(e.http)
	benchkit.WaitPort(e.ssh)
}

func lastField(s string) string {
	f := strings.Fields(s)
	return f[len(f)-1]
}

// row is one attack's figures.
type row struct {
	attack        attack
	base, under   honestResult
	aloneCPU      time.Duration
	aloneWall     time.Duration
	tmpPeak       int64 // largest DATA/tmp seen during the attack alone
	attackerNotes string
}

// measure runs one attack's three phases.
func (e *env) measure(a attack, d time.Duration) row {
	r := row{attack: a}
	e.start(a.name)
	r.base = e.honest(context.Background(), d)
	log.Printf("   baseline: %s", r.base)

	ctx, cancel := context.WithCancel(context.Background())
	stats := &attackStats{}
	done := make(chan struct{})
	e.resets.Store(0)
	go func() { a.run(ctx, e, stats); close(done) }()
	time.Sleep(2 * time.Second) // the attack in place before the honest clients start
	r.under = e.honest(context.Background(), d)
	log.Printf("   under attack: %s", r.under)
	cancel()
	<-done
	stats.resetConnecting = e.resets.Swap(0)

	ctx, cancel = context.WithCancel(context.Background())
	done = make(chan struct{})
	alone := &attackStats{}
	go func() { a.run(ctx, e, alone); close(done) }()
	time.Sleep(time.Second)
	cpu0, t0 := e.server.Group.Read(), time.Now()
	for time.Since(t0) < d {
		time.Sleep(500 * time.Millisecond)
		r.tmpPeak = max(r.tmpPeak, benchkit.DirSize(filepath.Join(e.data, "tmp")))
	}
	r.aloneCPU, r.aloneWall = e.server.Group.Read()-cpu0, time.Since(t0)
	cancel()
	<-done
	alone.resetConnecting = e.resets.Swap(0)
	r.attackerNotes = stats.String()
	log.Printf("   attack alone: server CPU %.1f%% of a core; attacker (under attack): %s; attacker (alone): %s", 100*r.aloneCPU.Seconds()/r.aloneWall.Seconds(), r.attackerNotes, alone)
	time.Sleep(2 * time.Second) // let the server let go of the attack's connections
	return r
}

func report(e *env, scale float64, d time.Duration, rows []row, lost []string) string {
	var b strings.Builder
	host, _ := os.Hostname()
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Fprintf(&b, "# Hostile clients against packwire\n\n")
	fmt.Fprintf(&b, "Run %s on %s (load average at the end: %s), `go run ./bench/hostile -duration %s`. ",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), host, strings.TrimSpace(string(load)), d)
	fmt.Fprintf(&b, "A jquery-shaped synth repository at scale %g; `packwire serve %s`. ", scale, strings.Join(e.serveArgs, " "))
	fmt.Fprintf(&b, "Honest load: 8 clone loops (git://, HTTP and SSH in turn, protocol v2) and 2 pushers "+
		"(HTTP and SSH, a new branch per push) from 127.0.0.1; attacks from %s. Per attack, three phases of %s: "+
		"the honest load alone, the honest load under the attack, the attack alone (server CPU: its cgroup, git included).\n\n", e.attacker, d)
	b.WriteString("Goals: honest errors 0; honest median clone wall <= 1.5x the baseline; server CPU under 10% of a core for the idle-connection, trickle and malformed-input attacks.\n\n")
	b.WriteString("| attack | honest ops (base / attack) | honest errors under attack | median clone wall: base / attack (ratio) | pushes acked under attack | server CPU, attack alone | DATA/tmp peak, attack alone | what the attacker saw |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		ratio := 0.0
		if r.base.medianClone > 0 {
			ratio = r.under.medianClone.Seconds() / r.base.medianClone.Seconds()
		}
		fmt.Fprintf(&b, "| %s | %d / %d | %d%s | %s / %s (%.2fx) | %d | %.1f%% of a core | %.1f MiB | %s |\n",
			r.attack.name, r.base.ops, r.under.ops, r.under.errors, firstErr(r.under), ms(r.base.medianClone), ms(r.under.medianClone), ratio,
			r.under.pushes, 100*r.aloneCPU.Seconds()/r.aloneWall.Seconds(), float64(r.tmpPeak)/(1<<20), r.attackerNotes)
	}
	b.WriteString("\nAttacks:\n\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "- **%s**: %s\n", r.attack.name, r.attack.what)
	}
	if len(lost) == 0 {
		b.WriteString("\nLost pushes: none (every acknowledged push's branch is on the server at the end).\n")
	} else {
		sort.Strings(lost)
		fmt.Fprintf(&b, "\n**Lost pushes: %d** (%s)\n", len(lost), strings.Join(lost, ", "))
	}
	return b.String()
}

func firstErr(h honestResult) string {
	if h.errors == 0 || h.firstError == "" {
		return ""
	}
	return fmt.Sprintf(" (`%s`)", strings.ReplaceAll(h.firstError, "|", "/"))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d.Microseconds())/1000) }
