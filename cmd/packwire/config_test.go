package main

import (
	"bufio"
	"context"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"packwire/internal/server"
	"packwire/internal/store"
)

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "packwire.toml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestServeConfigFile: every kind of value a config file holds reaches the
// server's configuration, flags on the command line win, and $PACKWIRE_CONFIG
// names the file when --config does not.
func TestServeConfigFile(t *testing.T) {
	path := writeConfig(t, `# packwire serve --config
data = "/srv/git"
http = "127.0.0.1:8081"
git = ""
max-pack-jobs = 8
max-request-body = 1048576
timeout = "90s"
records-max-age = "7d"
fetch-cache = false
allow-unreachable-wants = true
ssh-ciphers = ["aes128-gcm@openssh.com", "chacha20-poly1305@openssh.com"]
trusted-proxies = ["10.0.0.0/8", "192.0.2.7"]
grace = "5s"
log-format = "json"
`)
	cfg, grace, err := parseServe([]string{"--config", path, "--max-pack-jobs", "3", "--git", ":9419"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := server.Defaults
	if cfg.DataDir != "/srv/git" || cfg.HTTPAddr != "127.0.0.1:8081" || cfg.MaxRequestBody != 1<<20 ||
		cfg.IdleTimeout != 90*time.Second || cfg.RecordsMaxAge != 7*24*time.Hour || cfg.FetchCache || !cfg.AllowUnreachableWants ||
		strings.Join(cfg.SSHCiphers, ",") != "aes128-gcm@openssh.com,chacha20-poly1305@openssh.com" || grace != 5*time.Second ||
		cfg.TrustedProxies.String() != "10.0.0.0/8,192.0.2.7/32" {
		t.Fatalf("file values not applied: %+v grace %s", cfg, grace)
	}
	if cfg.MaxPackJobs != 3 || cfg.GitAddr != ":9419" {
		t.Fatalf("the command line did not override the file: max-pack-jobs %d, git %q", cfg.MaxPackJobs, cfg.GitAddr)
	}
	if cfg.SSHAddr != want.SSHAddr || cfg.MaxQueue != want.MaxQueue {
		t.Fatalf("keys not in the file changed: ssh %q, max-queue %d", cfg.SSHAddr, cfg.MaxQueue)
	}
	if !cfg.TrustedProxies.Contains(netip.MustParseAddr("10.1.2.3")) || cfg.TrustedProxies.Contains(netip.MustParseAddr("192.0.2.8")) {
		t.Fatalf("trusted proxies: %s", cfg.TrustedProxies)
	}

	t.Setenv(envConfig, path)
	cfg, _, err = parseServe(nil, io.Discard)
	if err != nil || cfg.MaxPackJobs != 8 {
		t.Fatalf("$%s: max-pack-jobs %d, %v", envConfig, cfg.MaxPackJobs, err)
	}
}

// TestServeConfigFileErrors: unknown keys and values of the wrong type are
// usage errors naming the file, the line and the key, also for keys the
// command line overrides.
func TestServeConfigFileErrors(t *testing.T) {
	for _, c := range []struct {
		text, args, want string
	}{
		{"http = \":8080\"\n\n# tuning\n\n\n\n\n\n\n\n\nmax-pak-jobs = 8\n", "", `:12: unknown key "max-pak-jobs" (did you mean "max-pack-jobs"?)`},
		{"[server]\nhttp = \":8080\"\n", "", `:1: unknown key "server"`},
		{"http = \":8080\"\nmax-pack-jobs = \"8\"\n", "", `:2: max-pack-jobs: want a whole number (no quotes), got the string "8"`},
		{"max-pack-jobs = \"8\"\n", "--max-pack-jobs 4", `:1: max-pack-jobs: want a whole number`},
		{"timeout = 30\n", "", `:1: timeout: want a duration as a string ("30s", "10m", "30d"), got the number 30`},
		{"timeout = \"30 seconds\"\n", "", `:1: timeout = "30 seconds": a duration like 720h, 30m, 90s or 30d`},
		{"fetch-cache = \"off\"\n", "", `:1: fetch-cache: want true or false, got the string "off"`},
		{"http = [1, 2]\n", "", `:1: http: want a string or a list of strings, got a list holding the number 1`},
		{"config = \"other.toml\"\n", "", `:1: unknown key "config"`},
		{"http = \":8080\n", "", `:1: `},
	} {
		path := writeConfig(t, c.text)
		_, _, err := parseServe(append([]string{"--config", path}, strings.Fields(c.args)...), io.Discard)
		ue, ok := err.(usageError)
		if !ok || !strings.Contains(ue.msg, "config "+path+c.want) {
			t.Errorf("%q: %v, want a usage error with %q", c.text, err, "config FILE"+c.want)
		}
	}
	if _, _, err := parseServe([]string{"--config", filepath.Join(t.TempDir(), "none.toml")}, io.Discard); err == nil || !strings.Contains(err.Error(), "none.toml: no such file") {
		t.Errorf("missing config file: %v", err)
	}
}

// TestServeSizeFlag: --ssh-max-unacked takes sizes as its help says (it
// was refused as "not a whole number"), on the command line and in the
// config file, as a string or a whole number; a bad one names the flag.
func TestServeSizeFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		text string
		want int
	}{
		{args: []string{"--ssh-max-unacked", "1M"}, want: 1 << 20},
		{args: []string{"--ssh-max-unacked=768K"}, want: 768 << 10},
		{args: []string{"--ssh-max-unacked", "300000"}, want: 300000},
		{args: []string{"--ssh-max-unacked", "0"}, want: 0},
		{text: "ssh-max-unacked = \"2MiB\"\n", want: 2 << 20},
		{text: "ssh-max-unacked = 524288\n", want: 512 << 10},
		{want: server.Defaults.SSHMaxUnacked},
	} {
		args := c.args
		if c.text != "" {
			args = []string{"--config", writeConfig(t, c.text)}
		}
		cfg, _, err := parseServe(args, io.Discard)
		if err != nil || cfg.SSHMaxUnacked != c.want {
			t.Errorf("%q %q: %d, %v; want %d", args, c.text, cfg.SSHMaxUnacked, err, c.want)
		}
	}
	for _, args := range [][]string{{"--ssh-max-unacked", "1X"}, {"--ssh-max-unacked", "-1"}, {"--config", writeConfig(t, "ssh-max-unacked = \"lots\"\n")}} {
		_, _, err := parseServe(args, io.Discard)
		if _, ok := err.(usageError); !ok || !strings.Contains(err.Error(), "ssh-max-unacked") || !strings.Contains(err.Error(), "a size like") {
			t.Errorf("%q: %v, want a usage error naming the flag and what a size is", args, err)
		}
	}
	if _, _, err := parseServe([]string{"--help"}, io.Discard); err == nil || !strings.Contains(err.Error(), "--ssh-max-unacked SIZE") || !strings.Contains(err.Error(), "(default 512K)") {
		t.Errorf("help does not show the flag as a size with its default: %v", err)
	}
}

// TestServeConfigFileEndToEnd: the real binary serves what its config file
// says (transports off or on, the data directory), and a flag overrides a
// key; a bad file stops it with exit 2 before anything is created.
func TestServeConfigFileEndToEnd(t *testing.T) {
	data := filepath.Join(t.TempDir(), "from-config")
	path := writeConfig(t, "data = \""+data+"\"\ngit = \"\"\nssh = \"\"\nhttp = \"127.0.0.1:0\"\nmaintain-interval = \"0s\"\n")
	cmd := exec.Command(binary, "serve", "--config", path, "--git", "127.0.0.1:0")
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(stdout)
	var lines []string
	for sc.Scan() && !strings.Contains(sc.Text(), "dashboard at") {
		lines = append(lines, sc.Text())
	}
	out := strings.Join(lines, "\n")
	// serve says which build it is first (TestVersion's line).
	if want := versionLine(t) + " serving " + filepath.Join(data, "repos") + " (pid "; len(lines) == 0 || !strings.HasPrefix(lines[0], want) {
		t.Errorf("serve's first line: %q, want %q", lines, want)
	}
	if !strings.Contains(out, "serving "+filepath.Join(data, "repos")) || !strings.Contains(out, "git://   listening on 127.0.0.1:") ||
		!strings.Contains(out, "http://  listening on 127.0.0.1:") || strings.Contains(out, "ssh://") {
		t.Fatalf("serve --config: want data from the file, git from the flag, http on, ssh off:\n%s", out)
	}
	cmd.Process.Signal(os.Interrupt)
	done := make(chan error, 1)
	go func() { io.Copy(io.Discard, stdout); done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve exited with %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not stop on SIGINT")
	}

	fresh := filepath.Join(t.TempDir(), "fresh")
	bad := writeConfig(t, "data = \""+fresh+"\"\nmax-pak-jobs = 8\n")
	if _, stderr, code := pw(t, "", nil, "serve", "--config", bad); code != 2 || stderr != "packwire: config "+bad+`:2: unknown key "max-pak-jobs" (did you mean "max-pack-jobs"?); the keys are the flags of packwire serve --help, without --`+"\n" {
		t.Fatalf("bad config: exit %d %q", code, stderr)
	}
	if _, err := os.Stat(fresh); err == nil {
		t.Fatal("serve with a bad config created its data directory")
	}
}

// TestServeDatabaseMaxConns: --database-max-conns bounds the store's pool
// (store.DefaultMaxConns without it), from the command line or the config
// file; below 1 is a usage error.
func TestServeDatabaseMaxConns(t *testing.T) {
	cfg, _, err := parseServe(nil, io.Discard)
	if err != nil || cfg.DatabaseMaxConns != store.DefaultMaxConns {
		t.Fatalf("default: %d %v, want %d", cfg.DatabaseMaxConns, err, store.DefaultMaxConns)
	}
	if cfg, _, err = parseServe([]string{"--database-max-conns", "5"}, io.Discard); err != nil || cfg.DatabaseMaxConns != 5 {
		t.Fatalf("--database-max-conns 5: %d %v", cfg.DatabaseMaxConns, err)
	}
	path := writeConfig(t, "database-max-conns = 7\n")
	if cfg, _, err = parseServe([]string{"--config", path}, io.Discard); err != nil || cfg.DatabaseMaxConns != 7 {
		t.Fatalf("database-max-conns = 7 in the file: %d %v", cfg.DatabaseMaxConns, err)
	}
	if _, _, err := parseServe([]string{"--database-max-conns", "0"}, io.Discard); err == nil {
		t.Fatal("--database-max-conns 0 accepted")
	}
}

// serveFlagsTaking lists serve's flags whose --help placeholder is ph ("N",
// "DURATION", "F"): every one of a class, whatever is added later.
func serveFlagsTaking(t *testing.T, ph string) []string {
	t.Helper()
	_, _, err := parseServe([]string{"--help"}, io.Discard)
	help, ok := err.(helpText)
	if !ok {
		t.Fatalf("serve --help: %v", err)
	}
	var names []string
	for _, line := range strings.Split(help.text, "\n") {
		if f := strings.Fields(line); len(f) == 2 && strings.HasPrefix(f[0], "--") && f[1] == ph {
			names = append(names, strings.TrimPrefix(f[0], "--"))
		}
	}
	return names
}

// TestServeRefusesOutOfRange: a negative count, size, rate or duration, a
// database pool below 1 and an SSH cipher x/crypto does not know stop
// serve with a usage error (exit 2) naming the flag or the file's key and
// the range, for every such flag of serve, on the command line and in the
// config file (also when the command line overrides the key). The old code
// started with all of them ("ssh-ciphers = none" then refused every SSH
// client).
func TestServeRefusesOutOfRange(t *testing.T) {
	counts, durations := serveFlagsTaking(t, "N"), serveFlagsTaking(t, "DURATION")
	if len(counts) < 20 || len(durations) < 15 || !slices.Contains(counts, "max-connections") || !slices.Contains(durations, "timeout") {
		t.Fatalf("flags found in --help: %v %v", counts, durations)
	}
	// good overrides bad on the command line: the file is checked anyway.
	type bad struct{ key, flagValue, tomlValue, want, good string }
	var cases []bad
	for _, name := range counts {
		if name != "database-max-conns" {
			cases = append(cases, bad{name, "-1", "-1", "must be a whole number of 0 or more", "1"})
		}
	}
	for _, name := range durations {
		cases = append(cases, bad{name, "-1s", `"-1s"`, "must be a duration of 0 or more", "1s"})
	}
	cases = append(cases,
		bad{"database-max-conns", "0", "0", "must be a whole number of 1 or more", "1"},
		bad{"ssh-ciphers", "none", `"none"`, `unknown cipher "none": the ciphers are aes128-gcm@openssh.com`, "aes128-ctr"},
		bad{"ssh-ciphers", "aes128-ctr,nope", `["aes128-ctr", "nope"]`, `unknown cipher "nope"`, "aes128-ctr"})
	for _, c := range cases {
		_, _, err := parseServe([]string{"--" + c.key, c.flagValue}, io.Discard)
		want := "--" + c.key + " " + c.flagValue + ": " + c.want
		if ue, ok := err.(usageError); !ok || !strings.Contains(ue.msg, want) {
			t.Errorf("--%s %s: %v, want a usage error with %q", c.key, c.flagValue, err, want)
		}
		path := writeConfig(t, "# tuning\n"+c.key+" = "+c.tomlValue+"\n")
		for _, args := range [][]string{{"--config", path}, {"--config", path, "--" + c.key, c.good}} {
			_, _, err = parseServe(args, io.Discard)
			if ue, ok := err.(usageError); !ok || !strings.Contains(ue.msg, "config "+path+":2: "+c.key+" = ") || !strings.Contains(ue.msg, c.want) {
				t.Errorf("%s = %s in the file, args %q: %v, want a usage error naming line 2 and %q", c.key, c.tomlValue, args[2:], err, c.want)
			}
		}
	}
	// Cancelled: a serve that started would stop at once, not hang the test.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var stderr strings.Builder
	if code := run(ctx, []string{"serve", "--timeout", "-1s", "--data", t.TempDir(), "--git", "127.0.0.1:0", "--http", "", "--ssh", ""}, io.Discard, &stderr); code != 2 {
		t.Errorf("serve --timeout -1s: exit %d, want 2: %s", code, stderr.String())
	}
	// In range, they are taken: 0 where it means "off", a known cipher.
	cfg, _, err := parseServe([]string{"--max-connections", "0", "--timeout", "0", "--ssh-ciphers", "aes256-ctr,aes128-gcm@openssh.com"}, io.Discard)
	if err != nil || cfg.MaxConnections != 0 || cfg.IdleTimeout != 0 || len(cfg.SSHCiphers) != 2 {
		t.Fatalf("values in range: %v %+v", err, cfg)
	}
}

// TestMaxPushesPerUserDefault: unset, --max-pushes-per-user is half of the
// --max-push-jobs in effect (at least 1); set on the command line or in the
// config file, it is what was given.
func TestMaxPushesPerUserDefault(t *testing.T) {
	for _, c := range []struct {
		args []string
		file string
		want int
	}{
		{nil, "", server.PushesPerUser(server.Defaults.MaxPushJobs)},
		{[]string{"--max-push-jobs", "10"}, "", 5},
		{[]string{"--max-push-jobs", "1"}, "", 1},
		{[]string{"--max-push-jobs", "0"}, "", 0},
		{[]string{"--max-push-jobs", "10", "--max-pushes-per-user", "7"}, "", 7},
		{nil, "max-push-jobs = 12\n", 6},
		{nil, "max-push-jobs = 12\nmax-pushes-per-user = 0\n", 0},
	} {
		args := c.args
		if c.file != "" {
			args = append([]string{"--config", writeConfig(t, c.file)}, args...)
		}
		cfg, _, err := parseServe(args, io.Discard)
		if err != nil || cfg.MaxPushesPerUser != c.want {
			t.Errorf("%q %q: max-pushes-per-user %d, want %d (%v)", c.args, c.file, cfg.MaxPushesPerUser, c.want, err)
		}
	}
}
