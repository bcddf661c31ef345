package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"packwire/internal/lab/rtt"
)

func cmdRTT(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("rtt", "rtt URL... [--delay D,...] [--protocol 0,2] [--op ls-remote,fetch,clone] [--runs N] [--json] [--ssh-key F] [--ssh-option O]...",
		`What network latency costs git against any server: each URL's ls-remote,
no-op fetch (into a clone made first) and shallow clone (--depth 1) run
through a delaying proxy (see "packwire netem") at each --delay, with each
--protocol, and with each way of reusing connections: SSH with and without
an OpenSSH master connection (ControlMaster, opened through the proxy
before measuring); HTTP with its connection kept alive within one git
command (all the reuse git has there) and without (git sends "Connection:
close", so every request opens a connection); git:// has none.

--delay is the round-trip time added. The table shows the round trips the
proxy counted (connects + turns), the median wall at each delay, and the
fit wall = a + b x RTT: b is how many round trips the operation really
waits for, a what it costs without added latency.

URLs: git://host[:port]/path, http(s)://host[:port]/path,
ssh://[user@]host[:port]/path or [user@]host:path. SSH host keys are
accepted into a temporary known_hosts.

example: packwire rtt git://localhost/team/app http://localhost:8080/team/app ssh://git@localhost:2222/team/app --delay 0,50ms,100ms`, stderr)
	delays := fs.String("delay", "0,50ms,100ms", "added round-trip times, comma-separated")
	protocols := fs.String("protocol", "0,2", "git protocol versions, comma-separated")
	ops := fs.String("op", "ls-remote,fetch,clone", "operations: ls-remote, fetch (no-op), clone (--depth 1)")
	runs := fs.Int("runs", 3, "runs per operation and delay; the median wall counts")
	asJSON := fs.Bool("json", false, "print the rows as JSON")
	sshKey := fs.String("ssh-key", "", "SSH private key to use (default: ssh's own choice)")
	var sshOpts stringList
	fs.Var(&sshOpts, "ssh-option", "extra ssh -o option, e.g. Ciphers=aes128-gcm@openssh.com (repeatable)")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	urls, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(urls) == 0 {
		return usagef("rtt needs at least one URL")
	}
	plan := rtt.Plan{Runs: *runs}
	if plan.Delays, err = parseDelays(*delays); err != nil {
		return usagef("--delay: %v", err)
	}
	if plan.Protocols, err = parseProtocols(*protocols); err != nil {
		return usagef("--protocol: %v", err)
	}
	if plan.Ops, err = parseOps(*ops); err != nil {
		return usagef("--op: %v", err)
	}
	if *runs < 1 {
		return usagef("--runs must be at least 1")
	}
	var targets []rtt.Target
	for _, u := range urls {
		t, err := rtt.ParseURL(u)
		if err != nil {
			return usagef("%v", err)
		}
		targets = append(targets, t)
	}
	dir, err := os.MkdirTemp("", "packwire-rtt-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	client := &rtt.Client{SSHKey: *sshKey, SSHOptions: sshOpts, Dir: dir}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
	defer stop()
	for i := range targets {
		client.ResolveSSH(ctx, &targets[i])
	}
	progress := func(s string) { fmt.Fprintln(stderr, s) }
	if *quiet {
		progress = nil
	}
	rows := client.Measure(ctx, targets, plan, progress)
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted")
	}
	where := "the table"
	if *asJSON {
		where = "the rows' errors"
		if err := writeJSON(stdout, struct {
			Delays []time.Duration `json:"delays"`
			Rows   []rtt.Row       `json:"rows"`
		}{plan.Delays, rows}); err != nil {
			return err
		}
	} else {
		writeRTTTable(stdout, plan.Delays, rows)
	}
	failed := 0
	for _, r := range rows {
		if r.Error != "" {
			failed++
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d measurements failed (see %s)", failed, len(rows), where)
	}
	return nil
}

func writeRTTTable(w io.Writer, delays []time.Duration, rows []rtt.Row) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	head := "URL\tOP\tPROTO\tREUSE\tCONNS\tROUND TRIPS"
	for _, d := range delays {
		head += "\t@" + d.String()
	}
	fmt.Fprintln(tw, head+"\tFIT a + b x RTT")
	for _, r := range rows {
		line := fmt.Sprintf("%s\t%s\tv%d\t%s\t", r.URL, r.Op, r.Protocol, r.Reuse)
		if r.Error != "" {
			fmt.Fprintf(tw, "%s-\t-\terror: %s\n", line, r.Error)
			continue
		}
		rt := strconv.Itoa(r.RoundTrips)
		if r.RoundTripsMax != r.RoundTrips {
			rt += "-" + strconv.Itoa(r.RoundTripsMax)
		}
		line += fmt.Sprintf("%d\t%s", r.Conns, rt)
		for _, d := range delays {
			wall := "-"
			for _, p := range r.Points {
				if p.Delay == d {
					wall = ms(p.Wall)
				}
			}
			line += "\t" + wall
		}
		fit := "-"
		if r.Fit.OK {
			fit = fmt.Sprintf("%s + %.1f x RTT", ms(r.Fit.Base), r.Fit.PerRTT)
		}
		fmt.Fprintln(tw, line+"\t"+fit)
	}
	tw.Flush()
}

func parseDelays(s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		d, err := time.ParseDuration(f)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("%q is not a duration like 50ms", f)
		}
		out = append(out, d)
	}
	return out, nil
}

func parseProtocols(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		switch strings.TrimPrefix(strings.TrimSpace(f), "v") {
		case "0":
			out = append(out, 0)
		case "1":
			out = append(out, 1)
		case "2":
			out = append(out, 2)
		default:
			return nil, fmt.Errorf("%q is not a protocol version (0, 1 or 2)", f)
		}
	}
	return out, nil
}

func parseOps(s string) ([]rtt.Op, error) {
	var out []rtt.Op
	for _, f := range strings.Split(s, ",") {
		switch strings.TrimSpace(f) {
		case "ls-remote":
			out = append(out, rtt.LsRemote)
		case "fetch":
			out = append(out, rtt.NoopFetch)
		case "clone":
			out = append(out, rtt.SmallClone)
		default:
			return nil, fmt.Errorf("%q is not an operation (ls-remote, fetch, clone)", f)
		}
	}
	return out, nil
}
