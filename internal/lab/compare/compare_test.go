package compare

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// lognormal draws durations around 100 ms with a spread like real timings.
func lognormal(rng *rand.Rand, median time.Duration, sigma float64) time.Duration {
	return time.Duration(float64(median) * math.Exp(rng.NormFloat64()*sigma))
}

func TestIdenticalDistributions(t *testing.T) {
	// Same distribution for A and B: "no significant difference" in all
	// but about 5% of seeds (the test's error rate at alpha 0.05; requiring
	// the interval too makes it rarer still).
	const seeds = 200
	differ := 0
	for seed := range uint64(seeds) {
		rng := rand.New(rand.NewPCG(seed, 1))
		var a, b []time.Duration
		for range 20 {
			a = append(a, lognormal(rng, 100*time.Millisecond, 0.2))
			b = append(b, lognormal(rng, 100*time.Millisecond, 0.2))
		}
		r := Analyze(a, b)
		if r.Verdict != VerdictNone {
			differ++
		}
		if r.CILow > r.MedianRatio || r.CIHigh < r.MedianRatio {
			t.Fatalf("seed %d: median %.3f outside its interval [%.3f, %.3f]", seed, r.MedianRatio, r.CILow, r.CIHigh)
		}
	}
	if differ > seeds*8/100 {
		t.Errorf("identical distributions judged different in %d of %d seeds, want about 5%% or fewer", differ, seeds)
	}
}

func TestBSlower(t *testing.T) {
	missed := 0
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 2))
		var a, b []time.Duration
		for range 20 {
			base := lognormal(rng, 100*time.Millisecond, 0.2) // run-to-run drift hits both
			a = append(a, lognormal(rng, base, 0.05))
			b = append(b, lognormal(rng, base*3/2, 0.05))
		}
		r := Analyze(a, b)
		if r.Verdict != VerdictAFaster {
			t.Fatalf("seed %d: B = 1.5 A judged %q (p %.4f, CI %.3f-%.3f)", seed, r.Verdict, r.PValue, r.CILow, r.CIHigh)
		}
		if r.CILow < 1.3 || r.CIHigh > 1.7 {
			t.Errorf("seed %d: 95%% CI [%.3f, %.3f], want it around 1.5", seed, r.CILow, r.CIHigh)
		}
		if r.CILow > 1.5 || r.CIHigh < 1.5 {
			missed++ // a 95% interval may miss now and then
		}
		if math.Abs(r.MedianRatio-1.5) > 0.1 {
			t.Errorf("seed %d: median ratio %.3f, want about 1.5", seed, r.MedianRatio)
		}
		// And the other way round.
		if r := Analyze(b, a); r.Verdict != VerdictBFaster || math.Abs(r.MedianRatio-1/1.5) > 0.05 {
			t.Errorf("seed %d: swapped, verdict %q ratio %.3f, want B faster at about 0.667", seed, r.Verdict, r.MedianRatio)
		}
	}
	if missed > 3 {
		t.Errorf("the 95%% interval missed 1.5 in %d of 20 seeds", missed)
	}
}

func TestSmallShiftNeedsPairs(t *testing.T) {
	// 3% slower with 1% pair noise but 20% drift between pairs: pairing
	// sees it, unpaired medians would not.
	rng := rand.New(rand.NewPCG(7, 7))
	var a, b []time.Duration
	for range 20 {
		base := lognormal(rng, 100*time.Millisecond, 0.2)
		a = append(a, lognormal(rng, base, 0.01))
		b = append(b, lognormal(rng, base*103/100, 0.01))
	}
	if r := Analyze(a, b); r.Verdict != VerdictAFaster {
		t.Errorf("3%% shift judged %q (p %.4f, CI %.3f-%.3f)", r.Verdict, r.PValue, r.CILow, r.CIHigh)
	}
}

func TestSignedRankKnownValues(t *testing.T) {
	// Fisher's (Darwin's) data as in scipy.stats.wilcoxon's documentation:
	// W = 24, exact two-sided p = 0.041259765625.
	d := []float64{6, 8, 14, 16, 23, 24, 28, 29, 41, -48, 49, 56, 60, -67, 75}
	if p := SignedRank(d); math.Abs(p-0.041259765625) > 1e-12 {
		t.Errorf("p = %v, want 0.041259765625", p)
	}
	// Six differences, all positive: p = 2/64.
	if p := SignedRank([]float64{1, 2, 3, 4, 5, 6}); math.Abs(p-2.0/64) > 1e-12 {
		t.Errorf("p = %v, want %v", p, 2.0/64)
	}
	// Five all positive can never be significant.
	if p := SignedRank([]float64{1, 2, 3, 4, 5}); p < Alpha {
		t.Errorf("five differences gave p = %v < %v", p, Alpha)
	}
	// Symmetric: p = 1; zeros dropped.
	if p := SignedRank([]float64{-1, 1, 0, 0}); p != 1 {
		t.Errorf("symmetric p = %v, want 1", p)
	}
	// Ties: five equal ratios are no more significant than five distinct ones.
	if p := SignedRank([]float64{1, 1, 1, 1, 1}); math.Abs(p-2.0/32) > 1e-12 {
		t.Errorf("five equal differences: p = %v, want %v", p, 2.0/32)
	}
	// Twenty equal positive differences are far from 0.
	ones := make([]float64, 20)
	for i := range ones {
		ones[i] = 1
	}
	if p := SignedRank(ones); p > 0.001 {
		t.Errorf("twenty equal positive differences: p = %v", p)
	}
	// The approximation agrees with the exact test where both apply.
	rng := rand.New(rand.NewPCG(3, 3))
	for range 5 {
		var d []float64
		for range 40 {
			d = append(d, rng.NormFloat64()+0.3)
		}
		exact := SignedRank(d)
		var w float64
		for _, r := range rankOf(d) {
			w += r
		}
		if approx := normalSignedRankP(40, w, 0); math.Abs(approx-exact) > 0.01 {
			t.Errorf("normal approximation %v, exact %v", approx, exact)
		}
	}
}

// rankOf returns the ranks of |d| of the positive differences (no ties).
func rankOf(d []float64) []float64 {
	var out []float64
	for _, x := range d {
		if x <= 0 {
			continue
		}
		rank := 1.0
		for _, y := range d {
			if math.Abs(y) < x {
				rank++
			}
		}
		out = append(out, rank)
	}
	return out
}

func TestAnalyzeEdges(t *testing.T) {
	r := Analyze(nil, nil)
	if r.Pairs != 0 || r.Verdict != VerdictNone || r.PValue != 1 {
		t.Errorf("no pairs: %+v", r)
	}
	r = Analyze([]time.Duration{0, 10, 20}, []time.Duration{5, 20, 40, 80})
	if r.Pairs != 2 || r.MedianRatio != 2 {
		t.Errorf("a zero sample and an unpaired one should be left out: %+v", r)
	}
	r = Analyze([]time.Duration{10, 10, 10, 10, 10}, []time.Duration{20, 20, 20, 20, 20})
	if r.Verdict != VerdictNone {
		t.Errorf("five pairs cannot be significant, got %q", r.Verdict)
	}
}

func TestRunShufflesAndCountsFailures(t *testing.T) {
	var log []string
	calls := 0
	a := func(context.Context) (time.Duration, error) {
		log = append(log, "A")
		return 10 * time.Millisecond, nil
	}
	b := func(context.Context) (time.Duration, error) {
		log = append(log, "B")
		calls++
		if calls == 5 {
			return 0, errors.New("exit status 1")
		}
		return 20 * time.Millisecond, nil
	}
	r, err := Run(context.Background(), Options{Pairs: 12, Warmup: 2, Seed: 42}, a, b)
	if err == nil || !strings.Contains(err.Error(), "B failed 1") || !strings.Contains(err.Error(), "exit status 1") {
		t.Fatalf("error %v, want B's one failure reported", err)
	}
	if r.FailuresB != 1 || r.FailuresA != 0 || r.Pairs != 11 || r.Verdict != VerdictAFaster || r.MedianRatio != 2 {
		t.Errorf("result %+v", r)
	}
	if len(log) != 4+24 || strings.Join(log[:4], "") != "ABAB" {
		t.Errorf("runs %v: want 2 warm-ups of each first, then 12 pairs", log)
	}
	ab, ba := 0, 0
	for _, o := range r.Orders {
		if o == "AB" {
			ab++
		} else {
			ba++
		}
	}
	if ab == 0 || ba == 0 {
		t.Errorf("orders %v: want both orders", r.Orders)
	}
	// The same seed gives the same orders.
	calls = -100
	r2, _ := Run(context.Background(), Options{Pairs: 12, Seed: 42}, a, b)
	if strings.Join(r2.Orders, ",") == "" || len(r2.Orders) != 12 {
		t.Errorf("orders %v", r2.Orders)
	}
	for i := range 2 { // the pairs before the earlier run's failure (its third)
		if r2.Orders[i] != r.Orders[i] {
			t.Errorf("seed 42 gave different orders: %v vs %v", r2.Orders, r.Orders)
			break
		}
	}

	// A failing warm-up stops at once.
	failing := func(context.Context) (time.Duration, error) { return 0, errors.New("no such file") }
	if _, err := Run(context.Background(), Options{Pairs: 5, Warmup: 1}, a, failing); err == nil || !strings.Contains(err.Error(), "warm-up run 1 of B") {
		t.Errorf("warm-up failure: %v", err)
	}
}

func TestCommand(t *testing.T) {
	if _, err := Command([]string{"packwire-no-such-command"}); err == nil {
		t.Error("a missing command was accepted")
	}
	run, err := Command([]string{"sh", "-c", "echo broken >&2; exit 3"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run(context.Background()); err == nil || !strings.Contains(err.Error(), "exit status 3") || !strings.Contains(err.Error(), "broken") {
		t.Errorf("failing command: %v", err)
	}
	run, _ = Command([]string{"true"})
	if d, err := run(context.Background()); err != nil || d <= 0 {
		t.Errorf("true: %v %v", d, err)
	}
}

func TestMedianAndPercentile(t *testing.T) {
	xs := []float64{5, 1, 4, 2}
	if got := Median(xs); got != 3 {
		t.Errorf("Median(%v) = %v, want 3", xs, got)
	}
	if !slices.Equal(xs, []float64{5, 1, 4, 2}) {
		t.Errorf("Median sorted its argument: %v", xs)
	}
	if got := Median([]time.Duration{3 * time.Second, time.Second, 2 * time.Second}); got != 2*time.Second {
		t.Errorf("odd median %v, want 2s", got)
	}
	if Median([]float64(nil)) != 0 || Median([]time.Duration{}) != 0 || Percentile([]float64(nil), 95) != 0 {
		t.Error("no values: want 0")
	}
	// Nearest rank: the ceil(p/100 x n)-th smallest.
	var v []float64
	for i := 20; i >= 1; i-- {
		v = append(v, float64(i))
	}
	for p, want := range map[float64]float64{95: 19, 100: 20, 50: 10, 1: 1, 0: 1} {
		if got := Percentile(v, p); got != want {
			t.Errorf("Percentile(1..20, %v) = %v, want %v", p, got, want)
		}
	}
	if v[0] != 20 {
		t.Errorf("Percentile sorted its argument: %v", v)
	}
}
