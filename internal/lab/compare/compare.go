// Package compare tells whether B is slower or faster than A when both are
// noisy: A and B run in pairs, the order shuffled in each pair (so drift,
// caches and the scheduler hit both alike), after warm-up runs; each pair
// gives a ratio B/A, and the verdict needs both the Wilcoxon signed-rank
// test on the log ratios (p < 0.05) and a bootstrap 95% confidence
// interval of the median ratio that excludes 1. Analyze is the statistics
// alone, for callers with their own samples.
package compare

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Verdicts.
const (
	VerdictAFaster = "A faster"
	VerdictBFaster = "B faster"
	VerdictNone    = "no significant difference"
)

// Alpha is the significance level of the verdict (and 1-Alpha the
// confidence of the interval).
const Alpha = 0.05

// MinPairs is the fewest pairs that can show a difference at Alpha: with
// five, even five ratios all above 1 have a two-sided p of 0.0625.
const MinPairs = 6

// bootstrapResamples and bootstrapSeed make the interval deterministic:
// the same samples always give the same interval.
const (
	bootstrapResamples = 10000
	bootstrapSeed      = 0x9e3779b97f4a7c15
)

// Result is the comparison of A and B. Ratios are B/A: above 1, B is slower.
type Result struct {
	Pairs       int       `json:"pairs"`
	Ratios      []float64 `json:"ratios"` // B/A per pair, in run order
	MedianRatio float64   `json:"median_ratio"`
	// CILow and CIHigh bound the median ratio with 95% confidence
	// (percentile bootstrap over the pairs).
	CILow  float64 `json:"ci_low"`
	CIHigh float64 `json:"ci_high"`
	// PValue is the two-sided Wilcoxon signed-rank p of log(B/A) against
	// 0 (exact without ties up to 50 pairs, else the normal approximation).
	PValue  float64       `json:"p_value"`
	Verdict string        `json:"verdict"`
	AMedian time.Duration `json:"a_median"`
	BMedian time.Duration `json:"b_median"`

	// Filled by Run: the samples in run order, the order of each pair
	// ("AB" or "BA"), and the runs that failed (their pairs are left out).
	A         []time.Duration `json:"a,omitempty"`
	B         []time.Duration `json:"b,omitempty"`
	Orders    []string        `json:"orders,omitempty"`
	FailuresA int             `json:"failures_a"`
	FailuresB int             `json:"failures_b"`
}

// Analyze compares paired samples: a[i] and b[i] are one pair. Pairs with
// a zero or negative duration, and the unpaired tail of the longer slice,
// are left out.
func Analyze(a, b []time.Duration) Result {
	var r Result
	var as, bs []time.Duration
	for i := range min(len(a), len(b)) {
		if a[i] <= 0 || b[i] <= 0 {
			continue
		}
		as, bs = append(as, a[i]), append(bs, b[i])
		r.Ratios = append(r.Ratios, float64(b[i])/float64(a[i]))
	}
	r.Pairs = len(r.Ratios)
	r.Verdict = VerdictNone
	if r.Pairs == 0 {
		r.PValue = 1 // and the ratios 0: there is nothing to estimate
		return r
	}
	r.AMedian, r.BMedian = Median(as), Median(bs)
	r.MedianRatio = Median(r.Ratios)
	r.CILow, r.CIHigh = bootstrapMedianCI(r.Ratios, 1-Alpha)
	logs := make([]float64, len(r.Ratios))
	for i, x := range r.Ratios {
		logs[i] = math.Log(x)
	}
	r.PValue = SignedRank(logs)
	if r.PValue < Alpha && (r.CILow > 1 || r.CIHigh < 1) {
		if r.MedianRatio > 1 {
			r.Verdict = VerdictAFaster
		} else {
			r.Verdict = VerdictBFaster
		}
	}
	return r
}

// Options control Run.
type Options struct {
	Pairs  int    // pairs to run (default 20)
	Warmup int    // runs of each before the pairs, not counted (negative: none; default 0)
	Seed   uint64 // seed of the order in each pair: the same seed, the same orders
	// OnRun, if set, is told about every counted run as it ends (err is
	// the run's failure, if it failed).
	OnRun func(pair int, which string, d time.Duration, err error)
}

// Run runs warm-ups, then the pairs, and analyzes them. A failing warm-up
// ends Run at once; a failing counted run drops its pair, is counted in
// FailuresA or FailuresB, and makes Run return an error along with the
// Result of the pairs that did not fail.
func Run(ctx context.Context, o Options, a, b func(context.Context) (time.Duration, error)) (Result, error) {
	if o.Pairs <= 0 {
		o.Pairs = 20
	}
	for i := range max(o.Warmup, 0) {
		for _, side := range []struct {
			name string
			fn   func(context.Context) (time.Duration, error)
		}{{"A", a}, {"B", b}} {
			if _, err := side.fn(ctx); err != nil {
				return Result{}, fmt.Errorf("warm-up run %d of %s failed: %w", i+1, side.name, err)
			}
		}
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x5eed))
	var as, bs []time.Duration
	var orders []string
	var failA, failB int
	var firstErr error
	for i := range o.Pairs {
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
		order := "AB"
		if rng.IntN(2) == 1 {
			order = "BA"
		}
		var da, db time.Duration
		var errA, errB error
		for _, which := range order {
			if which == 'A' {
				da, errA = a(ctx)
				report(o, i, "A", da, errA)
			} else {
				db, errB = b(ctx)
				report(o, i, "B", db, errB)
			}
		}
		if ctx.Err() != nil {
			return Result{}, ctx.Err()
		}
		if errA != nil {
			failA++
			firstErr = firstOf(firstErr, fmt.Errorf("pair %d, A: %w", i+1, errA))
		}
		if errB != nil {
			failB++
			firstErr = firstOf(firstErr, fmt.Errorf("pair %d, B: %w", i+1, errB))
		}
		if errA != nil || errB != nil {
			continue
		}
		as, bs, orders = append(as, da), append(bs, db), append(orders, order)
	}
	r := Analyze(as, bs)
	r.A, r.B, r.Orders, r.FailuresA, r.FailuresB = as, bs, orders, failA, failB
	if firstErr != nil {
		return r, fmt.Errorf("A failed %d and B failed %d of %d runs each (first failure: %w)", failA, failB, o.Pairs, firstErr)
	}
	return r, nil
}

func report(o Options, pair int, which string, d time.Duration, err error) {
	if o.OnRun != nil {
		o.OnRun(pair, which, d, err)
	}
}

func firstOf(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// Median is the median of xs: the middle value, or the mean of the two
// middle ones; 0 for none. xs is not modified.
func Median[T ~int64 | ~float64](xs []T) T {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Percentile is the p-th percentile (0 < p <= 100) of xs by nearest rank:
// the smallest value with at least p% of xs at or below it; 0 for none.
// xs is not modified.
func Percentile[T ~int64 | ~float64](xs []T, p float64) T {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// bootstrapMedianCI is the percentile bootstrap interval of the median.
// A resample is drawn as counts over the sorted values, so its median is a
// walk over the counts instead of a sort.
func bootstrapMedianCI(xs []float64, confidence float64) (lo, hi float64) {
	sorted := slices.Clone(xs)
	slices.Sort(sorted)
	n := len(sorted)
	rng := rand.New(rand.NewPCG(bootstrapSeed, uint64(n)))
	counts := make([]int, n)
	// kth returns the k-th smallest (0-based) value of the resample.
	kth := func(k int) float64 {
		seen := 0
		for i, c := range counts {
			seen += c
			if seen > k {
				return sorted[i]
			}
		}
		return sorted[n-1]
	}
	medians := make([]float64, bootstrapResamples)
	for i := range medians {
		clear(counts)
		for range n {
			counts[rng.IntN(n)]++
		}
		if n%2 == 1 {
			medians[i] = kth(n / 2)
		} else {
			medians[i] = (kth(n/2-1) + kth(n/2)) / 2
		}
	}
	slices.Sort(medians)
	tail := (1 - confidence) / 2
	return quantile(medians, tail), quantile(medians, 1-tail)
}

// quantile of sorted xs, linear between order statistics.
func quantile(sorted []float64, q float64) float64 {
	pos := q * float64(len(sorted)-1)
	i := int(math.Floor(pos))
	if i >= len(sorted)-1 {
		return sorted[len(sorted)-1]
	}
	frac := pos - float64(i)
	return sorted[i]*(1-frac) + sorted[i+1]*frac
}

// SignedRank is the two-sided p-value of the Wilcoxon signed-rank test
// that the differences d are centred on 0. Zeros are dropped (Wilcoxon's
// method). With at most 50 differences the p-value is exact (ties get
// average ranks and the exact distribution of those ranks); with more it
// is the normal approximation with the tie and continuity corrections.
func SignedRank(d []float64) float64 {
	var nz []float64
	for _, x := range d {
		if x != 0 && !math.IsNaN(x) {
			nz = append(nz, x)
		}
	}
	n := len(nz)
	if n == 0 {
		return 1
	}
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(i, j int) int {
		ai, aj := math.Abs(nz[i]), math.Abs(nz[j])
		switch {
		case ai < aj:
			return -1
		case ai > aj:
			return 1
		}
		return 0
	})
	// Average ranks over ties of |d|.
	ranks := make([]float64, n)
	var tieTerm float64 // sum of t^3 - t over tie groups
	for i := 0; i < n; {
		j := i
		for j+1 < n && math.Abs(nz[idx[j+1]]) == math.Abs(nz[idx[i]]) {
			j++
		}
		avg := float64(i+j)/2 + 1
		for k := i; k <= j; k++ {
			ranks[idx[k]] = avg
		}
		if t := float64(j - i + 1); t > 1 {
			tieTerm += t*t*t - t
		}
		i = j + 1
	}
	var wPlus float64
	for i, x := range nz {
		if x > 0 {
			wPlus += ranks[i]
		}
	}
	if n <= 50 {
		return exactSignedRankP(ranks, wPlus)
	}
	return normalSignedRankP(n, wPlus, tieTerm)
}

// normalSignedRankP is the normal approximation of the two-sided p of W+
// = w for n differences, with the tie correction (tieTerm: the sum of
// t^3 - t over groups of t tied ranks) and a continuity correction.
func normalSignedRankP(n int, w, tieTerm float64) float64 {
	nf := float64(n)
	mean := nf * (nf + 1) / 4
	variance := nf*(nf+1)*(2*nf+1)/24 - tieTerm/48
	if variance <= 0 {
		return 1
	}
	z := math.Max(math.Abs(w-mean)-0.5, 0) / math.Sqrt(variance)
	return math.Min(1, math.Erfc(z/math.Sqrt2))
}

// exactSignedRankP is the exact two-sided p of W+ = w given the ranks:
// every one of the 2^n sign assignments is equally likely. Tied ranks are
// averages, multiples of 1/2, so sums are counted in half-ranks.
func exactSignedRankP(ranks []float64, w float64) float64 {
	half := make([]int, len(ranks))
	maxSum := 0
	for i, r := range ranks {
		half[i] = int(math.Round(2 * r))
		maxSum += half[i]
	}
	counts := make([]float64, maxSum+1) // counts[s]: sign assignments with 2W+ = s
	counts[0] = 1
	for _, h := range half {
		for s := maxSum; s >= h; s-- {
			counts[s] += counts[s-h]
		}
	}
	total := math.Pow(2, float64(len(ranks)))
	// The distribution is symmetric around maxSum/2: take the smaller tail.
	hw := int(math.Round(2 * w))
	lowW := min(hw, maxSum-hw)
	var tail float64
	for s := 0; s <= lowW; s++ {
		tail += counts[s]
	}
	return math.Min(1, 2*tail/total)
}
