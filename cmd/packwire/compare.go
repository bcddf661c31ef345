package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"packwire/internal/lab/compare"
)

func cmdCompare(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("compare", "compare [-n PAIRS] [--warmup K] [--seed S] [--json] -- COMMAND_A [ARGS] -- COMMAND_B [ARGS]",
		`Is B faster or slower than A? Runs both commands in pairs, the order
shuffled in each pair, after --warmup runs of each, and reports each pair's
ratio B/A (above 1: B is slower), the median ratio with its 95% confidence
interval (bootstrap), the Wilcoxon signed-rank p-value, and a verdict: "A
faster", "B faster" or "no significant difference" (both the test at 0.05
and the interval must agree). At least 6 pairs are needed to show anything.

The commands run directly, without a shell: everything after the first
"--" up to the next "--" is A, the rest is B (so A cannot contain "--";
wrap it in sh -c '...' if it must). Their output is discarded. A command
that exits non-zero is a failure: its pair is left out, failures are
counted and reported, and the exit status is 1.

example: packwire compare -n 20 -- git ls-remote git://localhost/team/app -- git ls-remote http://localhost:8080/team/app`, stderr)
	pairs := fs.Int("n", 20, "pairs to run")
	warmup := fs.Int("warmup", 2, "runs of each command before the pairs, not counted")
	seed := fs.Uint64("seed", 0, "seed of the order in each pair (0: from the clock, printed)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	sep := slices.Index(args, "--")
	if sep < 0 {
		if slices.Contains(args, "-h") || slices.Contains(args, "-help") || slices.Contains(args, "--help") {
			return showHelp(fs)
		}
		return usagef("compare needs two commands: compare [FLAGS] -- COMMAND_A -- COMMAND_B")
	}
	pos, err := parseInterspersed(fs, args[:sep])
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("compare: unexpected argument %q before the first --", pos[0])
	}
	rest := args[sep+1:]
	sep = slices.Index(rest, "--")
	if sep < 0 {
		return usagef("compare needs a second -- before COMMAND_B")
	}
	argvA, argvB := rest[:sep], rest[sep+1:]
	if len(argvA) == 0 || len(argvB) == 0 {
		return usagef("compare: COMMAND_A and COMMAND_B must both be given")
	}
	if *pairs < 1 {
		return usagef("-n must be at least 1")
	}
	if *pairs < compare.MinPairs {
		fmt.Fprintf(stderr, "compare: with fewer than %d pairs no difference can be significant\n", compare.MinPairs)
	}
	runA, err := compare.Command(argvA)
	if err != nil {
		return err
	}
	runB, err := compare.Command(argvB)
	if err != nil {
		return err
	}
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano()%1_000_000) + 1
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
	defer stop()
	fmt.Fprintf(stderr, "compare: %d warm-up runs of each, then %d pairs (seed %d)\n", *warmup, *pairs, *seed)
	o := compare.Options{Pairs: *pairs, Warmup: *warmup, Seed: *seed}
	if !*asJSON {
		o.OnRun = func(pair int, which string, d time.Duration, err error) {
			if err != nil {
				fmt.Fprintf(stderr, "pair %d: %s failed: %v\n", pair+1, which, err)
			}
		}
	}
	r, runErr := compare.Run(ctx, o, runA, runB)
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted")
	}
	if *asJSON {
		out := struct {
			CommandA []string `json:"command_a"`
			CommandB []string `json:"command_b"`
			Seed     uint64   `json:"seed"`
			Error    string   `json:"error,omitempty"`
			compare.Result
		}{CommandA: argvA, CommandB: argvB, Seed: *seed, Result: r}
		if runErr != nil {
			out.Error = runErr.Error()
		}
		if err := writeJSON(stdout, out); err != nil {
			return err
		}
		return runErr
	}
	if r.Pairs == 0 && runErr != nil {
		return runErr
	}
	writeComparison(stdout, argvA, argvB, r)
	return runErr
}

func writeComparison(w io.Writer, argvA, argvB []string, r compare.Result) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "pair\torder\tA\tB\tB/A\t")
	for i := range r.Pairs {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%.3f\t\n", i+1, r.Orders[i], ms(r.A[i]), ms(r.B[i]), r.Ratios[i])
	}
	tw.Flush()
	fmt.Fprintf(w, "A: %s (median %s)\n", strings.Join(argvA, " "), ms(r.AMedian))
	fmt.Fprintf(w, "B: %s (median %s)\n", strings.Join(argvB, " "), ms(r.BMedian))
	fmt.Fprintf(w, "B/A median ratio %.3f, 95%% CI %.3f-%.3f (bootstrap, %d pairs), Wilcoxon signed-rank p = %.4g\n",
		r.MedianRatio, r.CILow, r.CIHigh, r.Pairs, r.PValue)
	if r.FailuresA+r.FailuresB > 0 {
		fmt.Fprintf(w, "failures: A %d, B %d (their pairs are left out)\n", r.FailuresA, r.FailuresB)
	}
	switch r.Verdict {
	case compare.VerdictAFaster:
		fmt.Fprintf(w, "verdict: A faster (B takes %.2fx as long)\n", r.MedianRatio)
	case compare.VerdictBFaster:
		fmt.Fprintf(w, "verdict: B faster (B takes %.2fx as long)\n", r.MedianRatio)
	default:
		fmt.Fprintf(w, "verdict: %s\n", r.Verdict)
	}
}
