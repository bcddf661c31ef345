package report

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"packwire/internal/lab/bench"
)

func ptr[T any](v T) *T { return &v }

// sampleResult is a small run in the shape bench.Run returns: T1 and T2
// measured by the governor with one user, T5 without server cost, and a
// failed clone.
func sampleResult() *bench.Result {
	t0 := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	res := &bench.Result{Meta: bench.Meta{
		URL: "http://example.test:8080/team/app.git", Branch: "main", GitVersion: "2.39.5", Protocol: 2, Users: 1,
		Duration: "10s", PusherInterval: "2s", Scenarios: []string{"T1", "T2", "T5"},
		ServerCost: "packwire governor at http://example.test:8080", BytesMeasure: bench.BytesMeasure,
		Machine: bench.Machine{OS: "linux", Arch: "amd64", CPUs: 2}, Started: t0, Finished: t0.Add(time.Minute),
	}}
	add := func(sc string, seq int, wall float64, server *float64, reset *float64, result string) {
		s := bench.Sample{Scenario: sc, Seq: seq, Start: t0.Add(time.Duration(seq) * time.Second), WallMS: wall, Bytes: 1000 * int64(seq+1),
			ServerCPUMS: server, ResetMS: reset, Result: result}
		if reset != nil {
			s.ResetBytes = ptr(int64(0))
		}
		if result == bench.ResultError {
			s.Error = "git clone: fatal: early EOF"
		}
		res.Samples = append(res.Samples, s)
	}
	// T1: walls 100, 200, 300, 400 ms; T2: 50, 50 ms and one error.
	for i, w := range []float64{100, 200, 300, 400} {
		add("T1", i, w, ptr(10.0*float64(i+1)), nil, bench.ResultOK)
	}
	add("T2", 0, 50, ptr(5.0), nil, bench.ResultOK)
	add("T2", 1, 50, ptr(5.0), nil, bench.ResultOK)
	add("T2", 2, 9, ptr(1.0), nil, bench.ResultError)
	add("T5", 0, 20, nil, ptr(4.0), bench.ResultOK)
	add("T5", 1, 40, nil, ptr(6.0), bench.ResultOK)
	res.Phases = []bench.Phase{
		{Scenario: "T1", Name: "full clone", Command: "git clone", Start: t0, End: t0.Add(10 * time.Second), Ops: 4,
			ServerCPUMS: ptr(100.0), ServerCPUPerOpMS: ptr(25.0), ServerRecords: 12, Check: &bench.Check{Want: "complete", OK: true}},
		{Scenario: "T2", Name: "shallow clone", Command: "git clone --depth 1", Start: t0, End: t0.Add(10 * time.Second), Ops: 2, Errors: 1,
			ServerCPUMS: ptr(11.0), ServerCPUPerOpMS: ptr(5.5), Check: &bench.Check{Want: "shallow", Shallow: false, OK: false}},
		{Scenario: "T5", Name: "full fetch into a full clone", Command: "git fetch", Start: t0, End: t0.Add(10 * time.Second), Ops: 2,
			ServerNote: "not measured (no governor, --server-cgroup or --server-pid)", Pushes: 5},
	}
	res.Pusher = bench.Pusher{Pushes: 5, Verified: true, Tip: "0123456789abcdef"}
	return res
}

func TestSummarize(t *testing.T) {
	sums := Summarize(sampleResult())
	if len(sums) != 3 {
		t.Fatalf("%d summaries", len(sums))
	}
	t1, t2, t5 := sums[0], sums[1], sums[2]
	if t1.Wall != (Stats{N: 4, Median: 250, Mean: 250, P95: 400}) {
		t.Fatalf("T1 wall %+v", t1.Wall)
	}
	if t1.ServerAttributed.Median != 25 || t1.ServerAttributed.N != 4 {
		t.Fatalf("T1 per-operation server CPU %+v", t1.ServerAttributed)
	}
	// The failed clone is counted, not averaged in.
	if t2.Wall.N != 2 || t2.Wall.Mean != 50 || len(t2.ErrorCounts) != 1 || t2.ErrorCounts[0].N != 1 {
		t.Fatalf("T2 %+v", t2)
	}
	if !t5.Fetch || t5.Reset.Median != 5 || t5.ServerPerOp != nil {
		t.Fatalf("T5 %+v", t5)
	}
}

func TestTextTables(t *testing.T) {
	var b bytes.Buffer
	if err := WriteText(&b, sampleResult()); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"Clones: client time and server git CPU per clone",
		"Fetches: fetch time, reset time and server git CPU per fetch",
		"250 ms (400 ms)",         // T1 mean (p95)
		"0.20x / 0.20x",           // T2's time against T1: 50/250 by median and mean
		"0.22x",                   // T2's server CPU against T1: 5.5/25
		"250 ms / 25 ms",          // the study's form for T1
		"not measured",            // T5's server CPU
		"30 / 5.0 / not measured", // the study's form for T5
		"2 (100%)",                // T5's fetches that received data
		"1 x error: git clone: fatal: early EOF",
		"T2: the repository is not shallow",
		"every pushed commit is in the server's main",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text output lacks %q:\n%s", want, out)
		}
	}
}

var (
	httpRE  = regexp.MustCompile(`https?://[^\s"'<>)]*`)
	assetRE = regexp.MustCompile(`(?i)<script|<link|<img|<iframe|@import|url\(|src=`)
)

// TestHTMLSelfContained: the report opens offline: no scripts, no remote
// assets; the only URLs are the SVG namespace and the measured target.
func TestHTMLSelfContained(t *testing.T) {
	res := sampleResult()
	dir := filepath.Join(t.TempDir(), "r")
	path, err := Write(dir, res)
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	html := string(page)
	if m := assetRE.FindString(html); m != "" {
		t.Fatalf("report.html has %q", m)
	}
	for _, u := range httpRE.FindAllString(html, -1) {
		if u != "http://www.w3.org/2000/svg" && !strings.HasPrefix(u, "http://example.test:8080") {
			t.Errorf("report.html refers to %s", u)
		}
	}
	for _, want := range []string{"<svg", "Clone time per operation", "Server CPU per clone", "Server CPU per fetch", "Fetches and pushes over time", "samples.csv"} {
		if !strings.Contains(html, want) {
			t.Errorf("report.html lacks %q", want)
		}
	}
	if strings.Count(html, "<svg") < 5 {
		t.Errorf("%d charts", strings.Count(html, "<svg"))
	}
}

func TestSamplesRoundTrip(t *testing.T) {
	res := sampleResult()
	dir := t.TempDir()
	if _, err := Write(dir, res); err != nil {
		t.Fatal(err)
	}
	back, err := ReadJSON(filepath.Join(dir, SamplesJSON))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(res)
	b, _ := json.Marshal(back)
	if !bytes.Equal(a, b) {
		t.Fatalf("samples.json does not read back the same:\n%s\n%s", a, b)
	}
	// Not measured is null, not zero.
	if back.Phases[2].ServerCPUMS != nil || back.Samples[7].ServerCPUMS != nil {
		t.Fatal("a server CPU that was not measured came back as a number")
	}
	f, err := os.Open(filepath.Join(dir, SamplesCSV))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(res.Samples)+1 || strings.Join(rows[0], ",") != strings.Join(CSVHeader, ",") {
		t.Fatalf("%d CSV rows, header %v", len(rows), rows[0])
	}
	if rows[8][9] != "" || rows[1][9] != "10.000" || rows[7][11] != "git clone: fatal: early EOF" {
		t.Fatalf("CSV rows %v / %v / %v", rows[1], rows[7], rows[8])
	}
	if _, err := ReadJSON(filepath.Join(dir, SamplesCSV)); err == nil {
		t.Fatal("a CSV file read as samples.json")
	}
}
