package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"packwire/internal/lab/advise"
	"packwire/internal/lab/rtt"
)

func cmdAdvise(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("advise", "advise URL... [--use dev|ci|ci-history|huge-repo] [--json] [--runs N] [--no-derive] [--clones LIST | --no-clone] [--ssh-key F] [--ssh-option O]...",
		`Measure one repository the way you reach it, then say how best to reach
it, with the measured numbers behind each line.

Give one or more URLs of the same repository (git://, http(s)://, ssh://,
user@host:path). Unless --no-derive, the transports not given are tried on
their default ports (git:// 9418, https:// 443, ssh://git@ 22) when the
port answers within a second. It measures the real round-trip time (TCP
connect), ls-remote and a no-op fetch with protocol v0 and v2, SSH with and
without a master connection, HTTP with its connection kept alive and with
one per request (round trips counted by a proxy that adds no delay), then
a full, a --depth 1, a --filter=tree:0, a --filter=blob:none and a
--filter=blob:none --sparse clone over the fastest way, each followed by a
checkout.

The advice: which URL, protocol v2 or not, connection reuse and what it
saves per fetch at your RTT, the clone option for --use (full + full
fetches for dev; --depth 1 for throw-away CI; treeless for CI that needs
history; blobless + sparse for huge repositories), and never shallow
fetches.

example: packwire advise git://localhost/team/app ssh://git@localhost:2222/team/app --use ci`, stderr)
	use := fs.String("use", "dev", "what the clone is for: dev, ci, ci-history, huge-repo")
	asJSON := fs.Bool("json", false, "print the measurements and the advice as JSON")
	runs := fs.Int("runs", 3, "runs of ls-remote and no-op fetch per variant (median)")
	noDerive := fs.Bool("no-derive", false, "measure only the URLs given")
	clones := fs.String("clones", "full,depth1,treeless,blobless,sparse", "clone variants to measure")
	noClone := fs.Bool("no-clone", false, "measure no clones (for a repository too big to clone now)")
	sshKey := fs.String("ssh-key", "", "SSH private key to use (default: ssh's own choice)")
	var sshOpts stringList
	fs.Var(&sshOpts, "ssh-option", "extra ssh -o option (repeatable)")
	simulate := fs.Duration("simulate-rtt", 0, "measure as if the server were this much farther away (a proxy adds the delay)")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	urls, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(urls) == 0 {
		return usagef("advise needs the repository's URL")
	}
	if *runs < 1 {
		return usagef("--runs must be at least 1")
	}
	u, err := advise.ParseUse(*use)
	if err != nil {
		return usagef("--use: %v", err)
	}
	variants := strings.Split(*clones, ",")
	for _, v := range variants {
		known := false
		for _, cv := range advise.CloneVariants {
			known = known || cv.Name == v
		}
		if !known {
			return usagef("--clones: unknown variant %q (full, depth1, treeless, blobless, sparse)", v)
		}
	}
	for _, s := range urls {
		if _, err := rtt.ParseURL(s); err != nil {
			return usagef("%v", err)
		}
	}
	dir, err := os.MkdirTemp("", "packwire-advise-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
	defer stop()
	o := advise.Options{
		Client: &rtt.Client{SSHKey: *sshKey, SSHOptions: sshOpts, Dir: dir},
		Runs:   *runs, Derive: !*noDerive, Clones: variants, NoClones: *noClone, AddedRTT: *simulate,
	}
	if !*quiet {
		o.Progress = func(s string) { fmt.Fprintln(stderr, s) }
	}
	m, err := advise.Measure(ctx, urls, o)
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted")
	}
	if err != nil {
		return err
	}
	advice, err := advise.Recommend(m, u)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(stdout, struct {
			Use          advise.Use          `json:"use"`
			Measurements advise.Measurements `json:"measurements"`
			Advice       []advise.Advice     `json:"advice"`
		}{u, m, advice})
	}
	for _, t := range m.Targets {
		if t.Error == "" {
			fmt.Fprintf(stdout, "%s: RTT %.2fms (TCP connect", t.URL, float64(t.RTT)/float64(time.Millisecond))
			if *simulate > 0 {
				fmt.Fprintf(stdout, " + %v simulated", *simulate)
			}
			fmt.Fprintln(stdout, ")")
		}
	}
	fmt.Fprintf(stdout, "\nadvice for %s:\n", u)
	for _, a := range advice {
		fmt.Fprintf(stdout, "- %s\n    evidence: %s\n", a.Text, a.Evidence)
	}
	return nil
}
