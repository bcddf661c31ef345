package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"packwire/internal/gittest"
	"packwire/internal/lab/labserver"
	"packwire/internal/lab/report"
)

func TestBenchFlags(t *testing.T) {
	out, code := packwire(t, "bench", "--help")
	if code != 0 {
		t.Fatalf("--help: exit %d", code)
	}
	for _, flag := range []string{"-url", "-scenarios", "-users", "-duration", "-iterations", "-pusher-interval", "-out", "-branch",
		"-push-url", "-token", "-server-cgroup", "-server-pid", "-governor", "-data", "-demo"} {
		if !strings.Contains(out, flag) {
			t.Errorf("--help does not list %s", flag)
		}
	}
	for args, want := range map[string]string{
		"bench":                         "--url is required",
		"bench --url x --scenarios T11": "unknown scenario",
		"bench --url x --duration 1s --iterations 2":      "exclude each other",
		"bench --url x --server-pid 1 --server-cgroup /x": "exclude each other",
		"bench --demo --url x":                            "--demo serves its own repository",
		"bench --url x --users 0":                         "--users must be at least 1",
		"bench extra --url x":                             "no arguments",
	} {
		out, code := packwire(t, strings.Fields(args)...)
		if code != 2 || !strings.Contains(out, want) {
			t.Errorf("%s: exit %d, %q; want 2 and %q", args, code, out, want)
		}
	}
	// A server that is not there is a clear error, not a report of nothing.
	out, code = packwire(t, "bench", "--url", "http://127.0.0.1:1/none.git", "--out", t.TempDir())
	if code != 1 || !strings.Contains(out, "cannot reach http://127.0.0.1:1/none.git") {
		t.Errorf("unreachable server: exit %d, %s", code, out)
	}
}

func startLabServer(t *testing.T) *labserver.Server {
	env := gittest.New(t)
	ls, err := labserver.Start(context.Background(), labserver.Options{
		DataDir: filepath.Join(t.TempDir(), "data"), Repo: "lab/cli", RecordsFlush: 20 * time.Millisecond,
		Build: func(ctx context.Context, path string) error {
			env.Build(path, gittest.Shape{Commits: 10, Files: 20, Seed: 5})
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ls.Close() })
	return ls
}

// TestBenchCommand runs the command against packwire with the admin token
// in the URL (the governor's token by default) and reads the report back.
func TestBenchCommand(t *testing.T) {
	t.Parallel()
	ls := startLabServer(t)
	data := t.TempDir()
	out, code := packwire(t, "bench", "--url", ls.PushURL, "--scenarios", "T1,T5", "--iterations", "2",
		"--pusher-interval", "100ms", "--data", data)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, out)
	}
	token := ls.Governor.Token
	if strings.Contains(out, token) {
		t.Fatal("the token was printed")
	}
	for _, want := range []string{"Clones:", "Fetches:", "T1 full", "T5 fetch→full", "report: "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "not measured") {
		t.Errorf("server CPU not measured although the URL carries an admin token:\n%s", out)
	}
	reports, _ := filepath.Glob(filepath.Join(data, "lab", "*", report.ReportHTML))
	if len(reports) != 1 {
		t.Fatalf("reports under DATA/lab: %v", reports)
	}
	res, err := report.ReadJSON(filepath.Join(filepath.Dir(reports[0]), report.SamplesJSON))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Samples) != 4 || len(res.Phases) != 2 || res.Phases[0].ServerCPUMS == nil {
		t.Fatalf("%d samples, phases %+v", len(res.Samples), res.Phases)
	}
	// The library takes 0 literally (v0, no pusher): the defaults are the flags'.
	if res.Meta.Protocol != 2 || res.Meta.PusherInterval != "100ms" {
		t.Fatalf("protocol %d, pusher interval %q; want the default 2 and the 100ms asked for", res.Meta.Protocol, res.Meta.PusherInterval)
	}
	for _, f := range []string{report.ReportHTML, report.SamplesJSON, report.SamplesCSV} {
		b, _ := os.ReadFile(filepath.Join(filepath.Dir(reports[0]), f))
		if strings.Contains(string(b), token) {
			t.Errorf("%s contains the token", f)
		}
	}
}

// TestBenchInterrupt: SIGINT in the middle of a phase still writes the report.
func TestBenchInterrupt(t *testing.T) {
	ls := startLabServer(t)
	dir := filepath.Join(t.TempDir(), "r")
	cmd := exec.Command(binary, "bench", "--url", ls.URL, "--scenarios", "T1", "--duration", "2m", "--out", dir)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "T1 full clone:") { // the phase has started
			break
		}
	}
	go func() {
		for sc.Scan() {
		}
	}()
	time.Sleep(500 * time.Millisecond)
	cmd.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
			t.Fatalf("exit: %v, want status 1 (interrupted)", err)
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("bench did not stop within 30 s of SIGINT")
	}
	res, err := report.ReadJSON(filepath.Join(dir, report.SamplesJSON))
	if err != nil {
		t.Fatal(err)
	}
	if !res.Meta.Interrupted || len(res.Phases) != 1 {
		t.Fatalf("interrupted %v, %d phases", res.Meta.Interrupted, len(res.Phases))
	}
	if _, err := os.Stat(filepath.Join(dir, report.ReportHTML)); err != nil {
		t.Fatal(err)
	}
}

// TestBenchDemo runs the demo at a tiny scale: synth, the in-process
// server with its admin token, maintenance, the governor, the report.
func TestBenchDemo(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "demo")
	out, code := packwire(t, "bench", "--demo", "--scale", "0.02", "--duration", "500ms", "--scenarios", "T1,T5", "--out", dir)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, out)
	}
	for _, want := range []string{"synth jquery x0.02", "report: " + filepath.Join(dir, report.ReportHTML), "every pushed commit is in the server's main"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	res, err := report.ReadJSON(filepath.Join(dir, report.SamplesJSON))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Phases) != 2 || res.Meta.Users != 2 || !strings.Contains(res.Meta.Target, "demo") {
		t.Fatalf("phases %d, users %d, target %q", len(res.Phases), res.Meta.Users, res.Meta.Target)
	}
	for _, ph := range res.Phases {
		if ph.Ops == 0 || ph.Errors != 0 || ph.ServerCPUMS == nil || ph.Check == nil || !ph.Check.OK {
			t.Fatalf("phase %+v", ph)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "server.log")); err != nil {
		t.Fatal(err)
	}
}
