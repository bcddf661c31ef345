package bench_test

import (
	"context"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"packwire/internal/lab/bench"
	"packwire/internal/lab/report"
)

// cancelAfter is a progress writer that cancels the run once the live line
// shows n completed operations: a cancel mid-phase without a timing guess.
type cancelAfter struct {
	n      int
	cancel context.CancelFunc
	mu     sync.Mutex
}

var opsRE = regexp.MustCompile(`ops (\d+)`)

func (c *cancelAfter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range opsRE.FindAllSubmatch(p, -1) {
		if n, _ := strconv.Atoi(string(m[1])); n >= c.n {
			c.cancel()
		}
	}
	return len(p), nil
}

// TestCancelStillReports stops a run in the middle of a phase: the run
// returns what it measured (server CPU included) and the report is written.
func TestCancelStillReports(t *testing.T) {
	ls := startLocal(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := time.Now()
	res, err := bench.Run(ctx, bench.Config{
		URL:            ls.URL,
		PushURL:        ls.PushURL,
		Scenarios:      []bench.Scenario{bench.Scenarios[0], bench.Scenarios[4]},
		Users:          2,
		Duration:       time.Minute,
		Protocol:       2,
		PusherInterval: 2 * time.Second,
		Governor:       ls.Governor,
		GovernorSettle: 300 * time.Millisecond,
		WorkDir:        t.TempDir(),
		Progress:       &cancelAfter{n: 2, cancel: cancel},
		ProgressTTY:    true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if time.Since(started) > 40*time.Second {
		t.Fatalf("the run went on for %s after the cancel", time.Since(started))
	}
	if !res.Meta.Interrupted || len(res.Phases) != 1 || !res.Phases[0].Interrupted {
		t.Fatalf("interrupted %v, phases %+v", res.Meta.Interrupted, res.Phases)
	}
	ph := res.Phases[0]
	if ph.Ops < 2 || ph.Errors != 0 || ph.Ops+ph.Canceled != len(res.Samples) {
		t.Fatalf("phase %+v with %d samples", ph, len(res.Samples))
	}
	if ph.ServerCPUMS == nil || *ph.ServerCPUMS <= 0 {
		t.Fatalf("server CPU of the measured part not read after the cancel: %s", ph.ServerNote)
	}

	dir := filepath.Join(t.TempDir(), "report")
	path, err := report.Write(dir, res)
	if err != nil {
		t.Fatal(err)
	}
	back, err := report.ReadJSON(filepath.Join(dir, report.SamplesJSON))
	if err != nil {
		t.Fatal(err)
	}
	if !back.Meta.Interrupted || len(back.Samples) != len(res.Samples) || filepath.Base(path) != report.ReportHTML {
		t.Fatalf("read back %d samples (wrote %d), interrupted %v", len(back.Samples), len(res.Samples), back.Meta.Interrupted)
	}
}
