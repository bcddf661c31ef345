package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestLabCommandsHelpAndBadInput(t *testing.T) {
	for cmd, flags := range map[string][]string{
		"netem":   {"--upstream", "--delay", "--jitter", "--rate", "--reset-after", "--json"},
		"rtt":     {"--delay", "--protocol", "--op", "--runs", "--json", "--ssh-key", "--ssh-option"},
		"compare": {"-n", "--warmup", "--seed", "--json"},
		"advise":  {"--use", "--json", "--runs", "--no-derive", "--clones", "--simulate-rtt", "--ssh-key"},
	} {
		out, code := packwire(t, cmd, "--help")
		if code != 0 {
			t.Errorf("%s --help: exit %d", cmd, code)
		}
		for _, f := range flags {
			if !strings.Contains(out, "  "+f) {
				t.Errorf("%s --help does not list %s:\n%s", cmd, f, out)
			}
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"netem"}, "needs --upstream"},
		{[]string{"netem", "--upstream", "h:1", "--rate", "10mbps"}, "want a number and a unit"},
		{[]string{"netem", "--upstream", "h:1", "--reset-after", "lots"}, "invalid size"},
		{[]string{"rtt"}, "at least one URL"},
		{[]string{"rtt", "/srv/app.git"}, "not a remote URL"},
		{[]string{"rtt", "git://h/x", "--delay", "fast"}, "not a duration"},
		{[]string{"rtt", "git://h/x", "--protocol", "3"}, "not a protocol version"},
		{[]string{"compare", "true"}, "needs two commands"},
		{[]string{"compare", "--", "true"}, "second --"},
		{[]string{"compare", "--", "--", "true"}, "must both be given"},
		{[]string{"advise", "git://h/x", "--use", "laptop"}, "unknown use"},
		{[]string{"advise", "git://h/x", "--clones", "huge"}, "unknown variant"},
	} {
		out, code := packwire(t, c.args...)
		if code != 2 || !strings.Contains(out, c.want) {
			t.Errorf("%v: exit %d, want 2 and %q:\n%s", c.args, code, c.want, out)
		}
	}
}

// time.ParseDuration reads a bare "0" itself: --delay 0,50ms needs no special case.
func TestParseDelays(t *testing.T) {
	got, err := parseDelays("0, 50ms,1s")
	if err != nil || !slices.Equal(got, []time.Duration{0, 50 * time.Millisecond, time.Second}) {
		t.Fatalf("parseDelays: %v, %v", got, err)
	}
	for _, bad := range []string{"-1ms", "fast", "50", ""} {
		if _, err := parseDelays(bad); err == nil {
			t.Errorf("parseDelays(%q): no error", bad)
		}
	}
}

func TestCompareCommand(t *testing.T) {
	// B sleeps 0.5 s: on a loaded machine starting `true` alone took 0.24 s,
	// and against a 0.05 s sleep one such pair turned the verdict.
	out, code := packwire(t, "compare", "-n", "8", "--warmup", "1", "--seed", "5", "--", "true", "--", "sleep", "0.5")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if !strings.Contains(out, "verdict: A faster") || !strings.Contains(out, "8 pairs") {
		t.Errorf("true against sleep 0.5:\n%s", out)
	}
	// A failing command is counted and reported, with exit status 1.
	out, code = packwire(t, "compare", "-n", "6", "--warmup", "0", "--json", "--", "true", "--", "sh", "-c", "exit 3")
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", code, out)
	}
	var r struct {
		FailuresB int    `json:"failures_b"`
		Error     string `json:"error"`
	}
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):strings.LastIndex(out, "}")+1]), &r); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if r.FailuresB != 6 || !strings.Contains(r.Error, "exit status 3") {
		t.Errorf("failures %d, error %q", r.FailuresB, r.Error)
	}
}

func TestNetemCommand(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	cmd := exec.Command(binary, "netem", "--upstream", ln.Addr().String(), "--delay", "40ms")
	stderr, _ := cmd.StderrPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	first, err := bufio.NewReader(stderr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	addr := regexp.MustCompile(`listening on (\S+),`).FindStringSubmatch(first)
	if addr == nil {
		t.Fatalf("no address in %q", first)
	}
	c, err := net.Dial("tcp", addr[1])
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for _, msg := range []string{"one", "two", "three"} {
		c.Write([]byte(msg))
		if _, err := io.ReadFull(c, make([]byte, len(msg))); err != nil {
			t.Fatal(err)
		}
	}
	// Connect + 3 exchanges = 4 round trips of 40 ms at least.
	if took := time.Since(start); took < 160*time.Millisecond-2*time.Millisecond {
		t.Errorf("3 exchanges and a connect through a 40 ms proxy took %v", took)
	}
	c.Close()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(line, "4 round trips (connect + 3 turns)") || !strings.Contains(line, "11 B up, 11 B down") {
		t.Errorf("connection line %q", line)
	}
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Errorf("netem after SIGINT: %v", err)
	}
}
