package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"packwire/internal/buildinfo"
	"packwire/internal/datadir"
	"packwire/internal/lab/bench"
	"packwire/internal/lab/labserver"
	"packwire/internal/lab/report"
)

const benchDescription = `Replay GitHub's clone/fetch study against a Git server with the real git
client: T1-T4 clones (full, --depth 1, --filter=tree:0, --filter=blob:none),
T5-T10 fetches into prepared clones (full, shallow, treeless, blobless;
T6/T8 with --depth 1), each followed by git reset --hard origin/BRANCH timed
separately, while a pusher pushes three changed files every
--pusher-interval. Each scenario runs as its own phase.

Server CPU per operation comes from packwire's governor (--token: a server
admin's HTTP token; the default governor is the http(s) base of --url), or
for another server on this machine from its cgroup (--server-cgroup) or
process tree (--server-pid); otherwise it is reported as not measured.

Prints the study's two tables and writes samples.json, samples.csv and
report.html to --out (default DATA/lab/<UTC time>). Ctrl-C stops and still
writes what was measured. --demo starts a packwire in this process on a
synthetic jquery-shaped repository and runs a short full matrix.

examples:
  packwire bench --demo
  packwire bench --url http://localhost:8080/team/app.git --token pwt_... --users 4 --duration 1m
  packwire bench --url http://localhost/app.git --server-cgroup /sys/fs/cgroup/cpuacct/nginx --scenarios T1,T2,T5-T10`

func cmdBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench", "bench --url URL [flags]\n       packwire bench --demo [flags]", benchDescription, stderr)
	repoURL := fs.String("url", "", "repository to clone and fetch (http(s)://, git://, ssh://)")
	scenarios := fs.String("scenarios", "all", "scenarios to run: T1,...,T10, ranges (T5-T10), clones, fetches or all")
	users := fs.Int("users", 1, "concurrent virtual users per scenario")
	dur := fs.Duration("duration", 30*time.Second, "how long each scenario runs")
	iterations := fs.Int("iterations", 0, "operations per user and scenario instead of --duration")
	pusherInterval := fs.Duration("pusher-interval", 2*time.Second, "how often the pusher pushes during fetch phases (0: no pusher)")
	out := fs.String("out", "", "directory for the report (default DATA/lab/<UTC yyyymmdd-hhmmss>)")
	branch := fs.String("branch", "", "branch to clone, fetch and push (default: the remote's HEAD)")
	pushURL := fs.String("push-url", "", "where the pusher pushes, with credentials if needed (default --url)")
	token := fs.String("token", "", "a packwire server admin's HTTP token, to read the governor (default: the password in --url)")
	cgroup := fs.String("server-cgroup", "", "server CPU from this cgroup (v2 cpu.stat or v1 cpuacct.usage directory)")
	pid := fs.Int("server-pid", 0, "server CPU from this process and its descendants (/proc)")
	govURL := fs.String("governor", "", "packwire governor base URL (default: the http(s) base of --url)")
	data := fs.String("data", datadir.Dir(), "data directory; reports go to DATA/lab/; $PACKWIRE_DATA sets the default")
	protocol := fs.Int("protocol", 2, "git protocol.version the clients use (0, 1 or 2)")
	work := fs.String("work", "", "directory for the clients' clones (default: the system temp dir)")
	demo := fs.Bool("demo", false, "start an in-process packwire on a synthetic jquery-shaped repository and run a short matrix")
	scale := fs.Float64("scale", 0.25, "with --demo: size of the synthetic repository (1: jquery's size)")
	rest, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(args, rest, 0, 0, "bench --url URL | --demo [FLAGS] (no arguments: the repository is --url)"); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	list, err := bench.ParseScenarios(*scenarios)
	if err != nil {
		return usagef("--scenarios: %v", err)
	}
	switch {
	case *users < 1:
		return usagef("--users must be at least 1")
	case *iterations < 0:
		return usagef("--iterations must not be negative")
	case set["iterations"] && set["duration"]:
		return usagef("--duration and --iterations exclude each other")
	case *dur <= 0 && *iterations == 0:
		return usagef("--duration must be positive")
	case *cgroup != "" && *pid != 0:
		return usagef("--server-cgroup and --server-pid exclude each other")
	case (*cgroup != "" || *pid != 0) && *govURL != "":
		return usagef("server CPU comes from --governor or from --server-cgroup/--server-pid, not both")
	case *pusherInterval < 0:
		return usagef("--pusher-interval must not be negative")
	case *demo && (*repoURL != "" || *pushURL != "" || *govURL != "" || *token != ""):
		return usagef("--demo serves its own repository: no --url, --push-url, --governor or --token")
	case !*demo && *repoURL == "":
		return usagef("--url is required (or --demo)")
	case *demo && *scale <= 0:
		return usagef("--scale must be positive")
	}

	cfg := bench.Config{
		URL: *repoURL, PushURL: *pushURL, Branch: *branch, Scenarios: list,
		Users: *users, Protocol: *protocol, WorkDir: *work,
		PusherInterval: *pusherInterval,
		Progress:       stderr, ProgressTTY: isTerminal(stderr),
	}
	if *iterations > 0 {
		cfg.Iterations = *iterations
	} else {
		cfg.Duration = *dur
	}

	dir := *out
	if dir == "" {
		dir = filepath.Join(*data, "lab", time.Now().UTC().Format("20060102-150405"))
	}

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); stop() }() // a second Ctrl-C kills at once

	if *demo {
		// A short matrix unless told otherwise: two users, 5 s per scenario.
		if !set["users"] {
			cfg.Users = 2
		}
		if !set["duration"] && !set["iterations"] {
			cfg.Duration = 5 * time.Second
		}
		if !set["pusher-interval"] {
			cfg.PusherInterval = time.Second
		}
		closeDemo, err := startDemo(ctx, &cfg, dir, *scale, stderr)
		if err != nil {
			return err
		}
		defer closeDemo()
	} else if err := chooseServerCost(ctx, &cfg, *cgroup, *pid, *govURL, *token, set["governor"], stderr); err != nil {
		return err
	}

	start := time.Now()
	res, err := bench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	res.Meta.Version = buildinfo.Get().Version
	if err := report.WriteText(stdout, res); err != nil {
		return err
	}
	path, err := report.Write(dir, res)
	if err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	fmt.Fprintf(stdout, "\nreport: %s (%s; samples.json and samples.csv beside it)\n", path, time.Since(start).Round(time.Second))
	if res.Meta.Interrupted {
		return errors.New("interrupted: the report holds what was measured until then")
	}
	return nil
}

// chooseServerCost picks where server CPU comes from. The governor is
// tried by default for http(s) targets; when it is not there (another
// server) or refuses, the run goes on with server CPU not measured, and
// says so. A governor asked for explicitly must work.
func chooseServerCost(ctx context.Context, cfg *bench.Config, cgroup string, pid int, govURL, token string, explicit bool, stderr io.Writer) error {
	var err error
	switch {
	case cgroup != "":
		cfg.ServerCPU, err = bench.NewCgroupReader(cgroup)
		return err
	case pid != 0:
		cfg.ServerCPU, err = bench.NewProcessTreeReader(pid)
		return err
	}
	if govURL == "" {
		govURL = bench.GovernorURL(cfg.URL)
	}
	if govURL == "" {
		cfg.Notes = append(cfg.Notes, "server CPU not measured: a git:// or ssh:// target needs --governor http://host:port (packwire) or --server-cgroup/--server-pid")
		fmt.Fprintln(stderr, "packwire bench: server CPU not measured (for a packwire target over git:// or ssh:// pass --governor http://host:port and --token)")
		return nil
	}
	if u, perr := url.Parse(govURL); perr != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usagef("--governor %q: want http(s)://host[:port]", govURL)
	}
	if token == "" {
		if u, perr := url.Parse(cfg.URL); perr == nil && u.User != nil {
			token, _ = u.User.Password()
		}
	}
	gov := &bench.Governor{URL: strings.TrimRight(govURL, "/"), Token: token}
	if !explicit {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := gov.Probe(pctx); err != nil {
			cfg.Notes = append(cfg.Notes, "server CPU not measured: "+err.Error())
			fmt.Fprintf(stderr, "packwire bench: server CPU not measured: %v\n", err)
			return nil
		}
	}
	cfg.Governor = gov
	return nil
}

// startDemo starts packwire in this process on a synthetic repository and
// points cfg at it. Its log goes to server.log in the report directory.
func startDemo(ctx context.Context, cfg *bench.Config, outDir string, scale float64, stderr io.Writer) (func(), error) {
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(outDir, "server.log"))
	if err != nil {
		return nil, err
	}
	dataDir, err := os.MkdirTemp("", "packwire-demo-")
	if err != nil {
		logFile.Close()
		return nil, err
	}
	cleanup := func() { logFile.Close(); os.RemoveAll(dataDir) }
	fmt.Fprintf(stderr, "demo: generating a jquery-shaped repository at scale %g and starting packwire on 127.0.0.1\n", scale)
	var described string
	began := time.Now()
	ls, err := labserver.Start(ctx, labserver.Options{
		DataDir:  dataDir,
		Repo:     "demo/jquery",
		Maintain: true,
		Log:      slog.New(slog.NewTextHandler(logFile, nil)),
		Build: func(ctx context.Context, path string) error {
			var err error
			described, err = buildDemoRepo(ctx, path, scale)
			return err
		},
	})
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("demo: %w", err)
	}
	fmt.Fprintf(stderr, "demo: %s, served at %s (ready in %s)\n", described, ls.URL, time.Since(began).Round(100*time.Millisecond))
	cfg.URL, cfg.PushURL, cfg.Governor = ls.URL, ls.PushURL, ls.Governor
	cfg.GovernorSettle = 500 * time.Millisecond // the demo server writes its records every 100 ms
	cfg.Target = fmt.Sprintf("packwire %s in this process over HTTP (demo), %s", buildinfo.Get().Version, described)
	cfg.Notes = append(cfg.Notes, "demo: the server runs in the bench's own process, on the same CPUs as the clients")
	return func() { ls.Close(); cleanup() }, nil
}

// isTerminal reports whether w is a terminal, for the live progress line.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
