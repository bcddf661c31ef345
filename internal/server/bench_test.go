package server

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"packwire/internal/gittest"
)

// BenchmarkRelayAccounting measures a 40 MiB clone over git:// with the
// governor's accounting on and off, in interleaved pairs on one server, and
// reports the median of each and their ratio:
//
//	go test -run '^$' -bench RelayAccounting -benchtime 10x ./internal/server
func BenchmarkRelayAccounting(b *testing.B) {
	s := startServer(b, nil)
	r, _ := s.Data.Repos.Create(context.Background(), "big")
	s.env.Build(r.Path, gittest.Shape{Commits: 2, Files: 40, BlobBytes: 1 << 20, Incompress: true, Seed: 11})
	gov := s.Pipeline.Governor
	dir := b.TempDir()
	clone := func() time.Duration {
		dst := filepath.Join(dir, "c")
		os.RemoveAll(dst)
		start := time.Now()
		if out, err := s.env.Run("", nil, "clone", "-q", s.gitURL("big"), dst); err != nil {
			b.Fatalf("clone: %v %s", err, out)
		}
		return time.Since(start)
	}
	clone() // warm-up
	var on, off []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		order := []bool{true, false}
		if i%2 == 1 {
			order = []bool{false, true}
		}
		for _, accounting := range order {
			if accounting {
				s.Pipeline.Governor = gov
				on = append(on, clone())
			} else {
				s.Pipeline.Governor = nil
				off = append(off, clone())
			}
		}
	}
	s.Pipeline.Governor = gov
	// Per-pair ratios show the noise: their spread is the bar a difference must clear.
	ratios := make([]float64, len(on))
	for i := range on {
		ratios[i] = float64(on[i]) / float64(off[i])
	}
	slices.Sort(ratios)
	med := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
	b.ReportMetric(float64(med(on).Milliseconds()), "ms/clone-accounting-on")
	b.ReportMetric(float64(med(off).Milliseconds()), "ms/clone-accounting-off")
	b.ReportMetric(ratios[len(ratios)/2], "pair-ratio-median")
	b.ReportMetric(ratios[len(ratios)/4], "pair-ratio-p25")
	b.ReportMetric(ratios[len(ratios)*3/4], "pair-ratio-p75")
}
