package bench_test

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"packwire/internal/gittest"
	"packwire/internal/governor"
	"packwire/internal/lab/bench"
	"packwire/internal/lab/labserver"
	"packwire/internal/lab/report"
	"packwire/internal/server"
)

// startLocal serves a small synthetic history (30 commits, 40 files in
// nested directories, tags, a branch) from an in-process packwire.
func startLocal(t *testing.T) *labserver.Server {
	t.Helper()
	env := gittest.New(t)
	ls, err := labserver.Start(context.Background(), labserver.Options{
		DataDir:      filepath.Join(t.TempDir(), "data"),
		Repo:         "lab/test",
		RecordsFlush: 20 * time.Millisecond,
		Build: func(ctx context.Context, path string) error {
			env.Build(path, gittest.Shape{Commits: 30, Files: 40, BlobBytes: 3000, Tags: 2, Branches: 1, Seed: 3})
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ls.Close() })
	return ls
}

// governorWindow reads the server's records directly (not through the lab
// API) for a phase's window.
func governorWindow(t *testing.T, ls *labserver.Server, from, to time.Time) (uploadPack, receivePack []governor.Record) {
	t.Helper()
	recs, _, err := ls.Server.Governor.After(context.Background(), 0, from, 100_000)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Start.After(to) {
			continue
		}
		switch r.Service {
		case "git-upload-pack":
			uploadPack = append(uploadPack, r)
		case "git-receive-pack":
			receivePack = append(receivePack, r)
		}
	}
	return uploadPack, receivePack
}

// timeline tells a fetch phase's story for a failure, in time order and in
// milliseconds from the phase's start: each fetch (the tip it left, pack
// bytes), each push, and each server record with its fetch-cache outcome.
// Values, not the pointers that %+v prints for a Sample.
func timeline(res *bench.Result, ph bench.Phase, samples []bench.Sample, up, rp []governor.Record) string {
	type event struct {
		at   time.Time
		text string
	}
	var evs []event
	for _, s := range samples {
		reset := "-"
		if s.ResetBytes != nil {
			reset = fmt.Sprint(*s.ResetBytes)
		}
		evs = append(evs, event{s.Start, fmt.Sprintf("user %d fetch #%d %s: %.1f ms (reset until %s), tip %.10s, %d pack bytes (reset %s) %s",
			s.User, s.Seq, s.Result, s.WallMS, sinceStart(ph, s.EndTime), s.Tip, s.Bytes, reset, s.Error)})
	}
	for _, p := range res.Pushes {
		if p.Phase == ph.Scenario {
			evs = append(evs, event{p.Start, fmt.Sprintf("push %.10s %s: returned at %s %s", p.Commit, p.Result, sinceStart(ph, p.End), p.Error)})
		}
	}
	for _, r := range append(append([]governor.Record{}, up...), rp...) {
		evs = append(evs, event{r.Start, fmt.Sprintf("  server %s %s: %d wants, %d haves, depth %d, %d bytes out, %.1f ms, fetch cache %q, %s",
			r.Service, r.Kind, r.Wants, r.Haves, r.Depth, r.BytesOut, float64(r.Wall)/float64(time.Millisecond), r.PackCache, r.Result)})
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].at.Before(evs[j].at) })
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "%s %s\n", sinceStart(ph, e.at), e.text)
	}
	return b.String()
}

func sinceStart(ph bench.Phase, t time.Time) string {
	return fmt.Sprintf("%+8.1fms", float64(t.Sub(ph.Start))/float64(time.Millisecond))
}

// staleFetches names the fetches whose tip is older than a push that had
// returned before they started.
func staleFetches(pushes []bench.Push, samples []bench.Sample) string {
	var landed []bench.Push
	order := map[string]int{}
	for _, p := range pushes {
		if p.Result == bench.ResultOK {
			order[p.Commit] = len(landed)
			landed = append(landed, p)
		}
	}
	var stale []string
	for _, s := range samples {
		need := -1
		for i, p := range landed {
			if p.End.Before(s.Start) {
				need = i
			}
		}
		if got, known := order[s.Tip]; s.Result == bench.ResultOK && need >= 0 && (!known || got < need) {
			stale = append(stale, fmt.Sprintf("fetch #%d started %v after push %.10s returned and got %.10s", s.Seq, s.Start.Sub(landed[need].End), landed[need].Commit, s.Tip))
		}
	}
	return strings.Join(stale, "\n")
}

func cpuMS(recs []governor.Record) float64 {
	var total float64
	for _, r := range recs {
		total += float64(r.CPU()) / float64(time.Millisecond)
	}
	return total
}

// TestStudyMatrix runs all ten scenarios against packwire with one user and
// the pusher, and checks each scenario's mechanics from both ends: the
// client's repository (shallow, filtered) and the server's records.
func TestStudyMatrix(t *testing.T) {
	ls := startLocal(t)
	res, err := bench.Run(context.Background(), bench.Config{
		URL:            ls.URL,
		PushURL:        ls.PushURL,
		Users:          1,
		Duration:       time.Second,
		Protocol:       2,
		PusherInterval: 200 * time.Millisecond,
		Governor:       ls.Governor,
		GovernorSettle: 300 * time.Millisecond,
		WorkDir:        t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Meta.Branch != "main" || res.Meta.Interrupted {
		t.Fatalf("meta: branch %q interrupted %v", res.Meta.Branch, res.Meta.Interrupted)
	}
	if strings.Contains(res.Meta.PushURL, "pwt_") {
		t.Fatalf("the push URL's token leaked into the result: %s", res.Meta.PushURL)
	}
	if len(res.Phases) != 10 {
		t.Fatalf("%d phases, want 10", len(res.Phases))
	}
	byScenario := map[string][]bench.Sample{}
	for _, s := range res.Samples {
		byScenario[s.Scenario] = append(byScenario[s.Scenario], s)
	}
	for _, ph := range res.Phases {
		t.Run(ph.Scenario, func(t *testing.T) {
			if ph.Ops == 0 || ph.Errors != 0 || ph.Note != "" {
				t.Fatalf("%d ops, %d errors, note %q; samples %+v", ph.Ops, ph.Errors, ph.Note, byScenario[ph.Scenario])
			}
			if ph.Check == nil || !ph.Check.OK || ph.Check.Error != "" {
				t.Fatalf("shape check: %+v", ph.Check)
			}
			// Server CPU is the governor's upload-pack records in the window.
			up, _ := governorWindow(t, ls, ph.Start, ph.End)
			if ph.ServerCPUMS == nil || ph.ServerCPUPerOpMS == nil {
				t.Fatalf("server CPU not measured: %s", ph.ServerNote)
			}
			// The API carries milliseconds with three decimals: equal to the microsecond per record.
			if want := cpuMS(up); *ph.ServerCPUMS <= 0 || math.Abs(*ph.ServerCPUMS-want) > 0.0005*float64(len(up))+1e-9 || ph.ServerRecords != len(up) {
				t.Fatalf("server CPU %.3f ms from %d records, the governor has %.3f ms in %d upload-pack records", *ph.ServerCPUMS, ph.ServerRecords, want, len(up))
			}
			if math.Abs(*ph.ServerCPUPerOpMS-*ph.ServerCPUMS/float64(ph.Ops)) > 1e-9 {
				t.Fatalf("per op %.3f != %.3f / %d", *ph.ServerCPUPerOpMS, *ph.ServerCPUMS, ph.Ops)
			}
			// With one user every record belongs to one operation.
			var attributed float64
			for _, s := range byScenario[ph.Scenario] {
				if s.ServerCPUMS == nil {
					t.Fatalf("sample %d has no server CPU", s.Seq)
				}
				attributed += *s.ServerCPUMS
			}
			if ph.ServerUnassigned != 0 || math.Abs(attributed-*ph.ServerCPUMS) > 1e-6 {
				t.Fatalf("per-operation CPU adds up to %.3f of %.3f ms (%d records unattributed)", attributed, *ph.ServerCPUMS, ph.ServerUnassigned)
			}
			kinds := map[string]int{}
			for _, r := range up {
				kinds[r.Kind]++
				if r.Protocol != 2 {
					t.Fatalf("upload-pack record %s with protocol v%d, want v2", r.ID, r.Protocol)
				}
			}
			switch ph.Scenario {
			case "T1":
				if kinds["full-clone"] != ph.Ops {
					t.Fatalf("kinds %v for %d full clones", kinds, ph.Ops)
				}
			case "T2":
				if !ph.Check.Shallow || kinds["shallow-clone"] != ph.Ops {
					t.Fatalf("T2: client shallow %v, server kinds %v", ph.Check.Shallow, kinds)
				}
			case "T3", "T4":
				filter := map[string]string{"T3": "tree:0", "T4": "blob:none"}[ph.Scenario]
				if ph.Check.Filter != filter || !ph.Check.Promisor || ph.Check.MissingObjects == 0 {
					t.Fatalf("%s: client check %+v", ph.Scenario, ph.Check)
				}
				filtered := 0
				for _, r := range up {
					if r.Kind == "partial-clone" && r.Filter == filter {
						filtered++
					}
				}
				if filtered < ph.Ops {
					t.Fatalf("%s: %d partial-clone records with filter %s for %d clones (kinds %v)", ph.Scenario, filtered, filter, ph.Ops, kinds)
				}
			default: // fetches: the pusher's commits arrive, and never late
				samples := byScenario[ph.Scenario]
				var pushes []bench.Push
				for _, p := range res.Pushes {
					if p.Phase == ph.Scenario {
						pushes = append(pushes, p)
					}
				}
				if ph.Pushes == 0 || ph.PushFailures != 0 || len(pushes) != ph.Pushes {
					t.Fatalf("%d pushes (%d recorded), %d failed", ph.Pushes, len(pushes), ph.PushFailures)
				}
				// Every push reached receive-pack: one push record each.
				_, rp := governorWindow(t, ls, pushes[0].Start, pushes[len(pushes)-1].End)
				received := 0
				for _, r := range rp {
					if r.Kind == "push" && r.Result == governor.ResultOK {
						received++
					}
				}
				if received != len(pushes) {
					t.Fatalf("%d receive-pack push records for %d pushes:\n%s", received, len(pushes), timeline(res, ph, samples, up, rp))
				}
				// The first push lands before the clock starts, so the first
				// fetch downloads it whatever the load.
				if !pushes[0].End.Before(ph.Start) {
					t.Fatalf("the phase's first push ended %v after the phase started:\n%s", pushes[0].End.Sub(ph.Start), timeline(res, ph, samples, up, rp))
				}
				if samples[0].Seq != 0 || samples[0].Bytes == 0 {
					t.Fatalf("the first fetch (#%d) downloaded nothing:\n%s", samples[0].Seq, timeline(res, ph, samples, up, rp))
				}
				// No fetch is stale: one that started after a push had
				// returned has that commit or a later one (the pusher is the
				// branch's only writer, so its pushes are in order).
				if stale := staleFetches(res.Pushes, samples); stale != "" {
					t.Fatalf("%s\n%s", stale, timeline(res, ph, samples, up, rp))
				}
				if ph.Scenario == "T9" || ph.Scenario == "T10" {
					lazy := 0
					for _, s := range samples {
						if s.ResetBytes != nil && *s.ResetBytes > 0 {
							lazy++
						}
					}
					if lazy == 0 {
						t.Fatalf("%s: no reset fetched missing objects:\n%s", ph.Scenario, timeline(res, ph, samples, up, rp))
					}
				}
			}
		})
	}
	if !res.Pusher.Verified || len(res.Pusher.Lost) != 0 || res.Pusher.Failures != 0 || res.Pusher.Pushes == 0 {
		t.Fatalf("pusher: %+v", res.Pusher)
	}
	if tip := strings.TrimSpace(gittest.New(t).Git(ls.RepoPath, "rev-parse", "refs/heads/main")); tip != res.Pusher.Tip {
		t.Fatalf("server's main is %s, the pusher verified against %s", tip, res.Pusher.Tip)
	}
}

// TestProtocolZero: Protocol 0 and PusherInterval 0 mean protocol v0 and no
// pusher, not the defaults: the server sees v0 requests (no Git-Protocol
// header) and no pushes.
func TestProtocolZero(t *testing.T) {
	ls := startLocal(t)
	t1, _ := bench.Lookup("T1")
	t5, _ := bench.Lookup("T5")
	res, err := bench.Run(context.Background(), bench.Config{
		URL:            ls.URL,
		PushURL:        ls.PushURL,
		Scenarios:      []bench.Scenario{t1, t5},
		Iterations:     2,
		Protocol:       0,
		PusherInterval: 0,
		Governor:       ls.Governor,
		GovernorSettle: 300 * time.Millisecond,
		WorkDir:        t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Meta.Protocol != 0 || res.Meta.PusherInterval != "off" {
		t.Fatalf("meta: protocol %d, pusher interval %q; want 0 and off", res.Meta.Protocol, res.Meta.PusherInterval)
	}
	if len(res.Pushes) != 0 || res.Pusher.Pushes != 0 || res.Pusher.Failures != 0 {
		t.Fatalf("pushes %+v, pusher %+v: want no pusher", res.Pushes, res.Pusher)
	}
	if len(res.Phases) != 2 {
		t.Fatalf("%d phases, want 2", len(res.Phases))
	}
	for _, ph := range res.Phases {
		if ph.Ops != 2 || ph.Errors != 0 || ph.Note != "" || ph.Pushes != 0 || ph.Check == nil || !ph.Check.OK {
			t.Fatalf("phase %+v", ph)
		}
		up, rp := governorWindow(t, ls, ph.Start, ph.End)
		if len(up) == 0 || len(rp) != 0 {
			t.Fatalf("%s: %d upload-pack and %d receive-pack records, want some and none", ph.Scenario, len(up), len(rp))
		}
		for _, r := range up {
			if r.Protocol != 0 {
				t.Fatalf("%s: upload-pack record %s with protocol v%d, want v0", ph.Scenario, r.ID, r.Protocol)
			}
		}
	}
}

// TestBusyServerErrorsCounted: a server that refuses most concurrent
// clones (one pack job, no waiting) yields errors that are counted with
// git's message and kept out of the timings, not hidden.
func TestBusyServerErrorsCounted(t *testing.T) {
	env := gittest.New(t)
	ls, err := labserver.Start(context.Background(), labserver.Options{
		DataDir: filepath.Join(t.TempDir(), "data"), Repo: "lab/busy", RecordsFlush: 20 * time.Millisecond,
		Build: func(ctx context.Context, path string) error {
			env.Build(path, gittest.Shape{Commits: 5, Files: 30, BlobBytes: 1 << 16, Incompress: true, Seed: 9})
			return nil
		},
		Mutate: func(c *server.Config) {
			c.MaxPackJobs, c.MaxPackJobsPerRepo, c.MaxQueue, c.MaxQueueWait = 1, 1, 1, time.Millisecond
			// Identical clones would share one git through the fetch cache
			// and never queue: this test needs each clone to want a slot.
			c.FetchCache = false
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	res, err := bench.Run(context.Background(), bench.Config{
		URL: ls.URL, Scenarios: []bench.Scenario{bench.Scenarios[0]}, Users: 4, Iterations: 4, Protocol: 2,
		Governor: ls.Governor, GovernorSettle: 300 * time.Millisecond, WorkDir: t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ph := res.Phases[0]
	t.Logf("%d ok, %d errors; e.g. %q", ph.Ops, ph.Errors, firstError(res))
	if ph.Errors == 0 || ph.Ops+ph.Errors != 16 {
		t.Fatalf("%d ok, %d errors of 16 clones against a one-slot server", ph.Ops, ph.Errors)
	}
	for _, s := range res.Samples {
		if s.Result == bench.ResultError && !strings.Contains(s.Error, "503") && !strings.Contains(s.Error, "busy") {
			t.Fatalf("error without git's message: %q", s.Error)
		}
	}
	var text strings.Builder
	if err := report.WriteText(&text, res); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), fmt.Sprintf("%d (%d errors)", ph.Ops, ph.Errors)) || !strings.Contains(text.String(), "x error: git clone:") {
		t.Fatalf("errors not in the tables:\n%s", text.String())
	}
}

func firstError(res *bench.Result) string {
	for _, s := range res.Samples {
		if s.Error != "" {
			return s.Error
		}
	}
	return ""
}
