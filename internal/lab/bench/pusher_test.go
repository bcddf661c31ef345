package bench_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"packwire/internal/lab/bench"
	"packwire/internal/needs"
)

// TestSlowPusher: on a machine so loaded that a commit and push take longer
// than a whole phase (here a git that sleeps a second before each push),
// the fetch phases still measure real fetches. The phase's first push lands
// before its clock starts, so every user's first fetch downloads it, and no
// fetch that starts after a push returned lacks its commit. When the first
// push started with the fetches, it landed after them, and a phase measured
// no-op fetches only (TestStudyMatrix's "no fetch brought new commits"
// under load, and any short --iterations run).
func TestSlowPusher(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("the slow git is a shell script")
	}
	git, err := exec.LookPath("git")
	if err != nil {
		needs.Missing(t, "git is not installed: run scripts/install-deps")
	}
	slow := filepath.Join(t.TempDir(), "git")
	script := "#!/bin/sh\nfor a; do if [ \"$a\" = push ]; then sleep 1; break; fi; done\nexec '" + strings.ReplaceAll(git, "'", `'\''`) + "' \"$@\"\n"
	if err := os.WriteFile(slow, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	ls := startLocal(t)
	t5, _ := bench.Lookup("T5")
	t10, _ := bench.Lookup("T10")
	res, err := bench.Run(context.Background(), bench.Config{
		URL:            ls.URL,
		PushURL:        ls.PushURL,
		Scenarios:      []bench.Scenario{t5, t10},
		Users:          2,
		Iterations:     2,
		Protocol:       2,
		PusherInterval: 200 * time.Millisecond,
		Git:            slow,
		WorkDir:        t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, ph := range res.Phases {
		var samples []bench.Sample
		for _, s := range res.Samples {
			if s.Scenario == ph.Scenario {
				samples = append(samples, s)
			}
		}
		var first *bench.Push
		for i, p := range res.Pushes {
			if p.Phase == ph.Scenario {
				first = &res.Pushes[i]
				break
			}
		}
		if ph.Ops != 4 || ph.Errors != 0 || first == nil || first.Result != bench.ResultOK {
			t.Fatalf("%s: %d ops, %d errors, first push %+v", ph.Scenario, ph.Ops, ph.Errors, first)
		}
		if !first.End.Before(ph.Start) {
			t.Errorf("%s: the first push returned %v after the phase started", ph.Scenario, first.End.Sub(ph.Start))
		}
		for _, s := range samples {
			if s.Seq != 0 {
				continue
			}
			if s.Tip != first.Commit || s.Bytes == 0 {
				t.Errorf("%s: user %d's first fetch left %.10s with %d pack bytes, want the pushed %.10s",
					ph.Scenario, s.User, s.Tip, s.Bytes, first.Commit)
			}
			if ph.Scenario == "T10" && (s.ResetBytes == nil || *s.ResetBytes == 0) {
				t.Errorf("T10: user %d's first reset fetched no missing blobs", s.User)
			}
		}
		if stale := staleFetches(res.Pushes, samples); stale != "" {
			t.Errorf("%s: %s", ph.Scenario, stale)
		}
		if t.Failed() {
			t.Fatalf("%s:\n%s", ph.Scenario, timeline(res, ph, samples, nil, nil))
		}
	}
	if !res.Pusher.Verified || len(res.Pusher.Lost) != 0 || res.Pusher.Failures != 0 {
		t.Fatalf("pusher: %+v", res.Pusher)
	}
}
