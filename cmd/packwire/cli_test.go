package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"packwire/internal/needs"
)

// pw runs the binary in dir (if not "") with extra environment variables,
// bounded in time, and returns stdout, stderr and the exit status.
func pw(t *testing.T, dir string, env []string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("packwire %s: still running after 30s", strings.Join(args, " "))
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return stdout.String(), stderr.String(), code
}

// leaves lists every runnable command of the table as the words that name
// it ("serve", "repo create"), so that a command added to the table is
// walked by the tests below without being listed here.
func leaves() [][]string {
	var out [][]string
	var walk func(words []string, c *command)
	walk = func(words []string, c *command) {
		words = append(words[:len(words):len(words)], c.name)
		if c.subs == nil {
			out = append(out, words)
			return
		}
		for _, s := range c.subs {
			walk(words, s)
		}
	}
	for _, c := range commands {
		walk(nil, c)
	}
	return out
}

var (
	// A flag line of a command's help: "  --name VALUE" or "  -o FILE".
	flagLine = regexp.MustCompile(`^  (--[a-z0-9][a-z0-9-]+|-[a-zA-Z])( [A-Z][A-Z:,.|-]*)?$`)
	// Go's own format, "  -name string", which the help must not use.
	goFlagLine = regexp.MustCompile(`^\s+-[a-z][a-z0-9-]+(\s|$)`)
)

// TestEveryCommandHelp: "CMD --help", "CMD -h" and "packwire help CMD"
// print CMD's usage on stdout and exit 0 for every command and subcommand
// of the table, with flags written --name VALUE; a group's --help lists its
// subcommands; the overview lists every command.
func TestEveryCommandHelp(t *testing.T) {
	t.Parallel()
	overview, _, code := pw(t, "", nil, "help")
	if code != 0 {
		t.Fatalf("packwire help: exit %d", code)
	}
	for _, words := range leaves() {
		name := strings.Join(words, " ")
		if !strings.Contains(overview, "\n  "+name) {
			t.Errorf("the overview does not list %q", name)
		}
		for _, form := range [][]string{append(words[:len(words):len(words)], "--help"), append(words[:len(words):len(words)], "-h"), append([]string{"help"}, words...)} {
			stdout, stderr, code := pw(t, "", nil, form...)
			if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "usage: packwire "+name) {
				t.Errorf("packwire %s: exit %d, stderr %q, stdout:\n%s", strings.Join(form, " "), code, stderr, stdout)
				continue
			}
			flags := 0
			_, flagSection, _ := strings.Cut(stdout, "\nflags:\n")
			for _, line := range strings.Split(stdout, "\n") {
				if goFlagLine.MatchString(line) {
					t.Errorf("packwire %s prints a flag Go's way: %q", strings.Join(form, " "), line)
				}
			}
			for _, line := range strings.Split(flagSection, "\n") {
				if strings.HasPrefix(line, "  -") {
					flags++
					if !flagLine.MatchString(line) {
						t.Errorf("packwire %s: flag line %q is not \"  --name VALUE\"", strings.Join(form, " "), line)
					}
				}
			}
			if strings.Contains(stdout, "\nflags:\n") != (flags > 0) {
				t.Errorf("packwire %s: %d flag lines under a flags: heading?\n%s", strings.Join(form, " "), flags, stdout)
			}
		}
	}
	for _, c := range commands {
		if c.subs == nil {
			continue
		}
		stdout, _, code := pw(t, "", nil, c.name, "--help")
		if code != 0 {
			t.Errorf("packwire %s --help: exit %d", c.name, code)
		}
		for _, s := range c.subs {
			if !strings.Contains(stdout, "  "+c.name+" "+s.name) {
				t.Errorf("packwire %s --help does not list %s:\n%s", c.name, s.name, stdout)
			}
		}
		if _, stderr, code := pw(t, "", nil, c.name); code != 2 || !strings.Contains(stderr, "needs a subcommand") {
			t.Errorf("packwire %s: exit %d, %s", c.name, code, stderr)
		}
		if _, stderr, code := pw(t, "", nil, c.name, "frob"); code != 2 || !strings.Contains(stderr, `unknown `+c.name+` command "frob"`) {
			t.Errorf("packwire %s frob: exit %d, %s", c.name, code, stderr)
		}
	}
	// Defaults are shown, and serve's --data names its environment variable.
	stdout, _, _ := pw(t, "", nil, "serve", "--help")
	for _, want := range []string{"  --max-pack-jobs N\n", "(default :9418)", "  --data DIR\n", "$PACKWIRE_DATA", "  --config FILE\n", "  --trusted-proxies CIDR,...\n",
		"(default true; --fetch-cache=false turns it off)"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("serve --help lacks %q", want)
		}
	}
}

// variadic commands take any number of arguments.
var variadic = map[string]bool{"maintain": true, "rtt": true, "advise": true, "compare": true, "cluster verify": true}

// TestExtraArgumentsRefused: every command given arguments it does not take
// exits 2 naming the first one it did not understand, and does nothing.
func TestExtraArgumentsRefused(t *testing.T) {
	data := newData(t)
	for _, words := range leaves() {
		name := strings.Join(words, " ")
		if variadic[name] {
			continue
		}
		help, _, _ := pw(t, "", nil, append(words, "--help")...)
		args := append(words[:len(words):len(words)], "x1", "x2", "x3", "x4", "x5", "x6")
		if strings.Contains(help, "  --data DIR") {
			args = append(args, "--data", data)
		}
		if strings.Contains(help, "  --git ADDR") {
			// If serve ever ignored the arguments, it must not take real ports.
			args = append(args, "--git", "127.0.0.1:0", "--http", "127.0.0.1:0", "--ssh", "127.0.0.1:0")
		}
		_, stderr, code := pw(t, "", nil, args...)
		if code != 2 || !regexp.MustCompile(`unexpected argument "x[1-6]"`).MatchString(stderr) {
			t.Errorf("packwire %s: exit %d, want 2 naming the extra argument:\n%s", strings.Join(args, " "), code, stderr)
		}
	}
	// A boolean flag's value written as an argument gets a hint.
	_, stderr, code := pw(t, "", nil, "serve", "--fetch-cache", "off", "--data", filepath.Join(t.TempDir(), "d"))
	if code != 2 || !strings.Contains(stderr, `unexpected argument "off" after --fetch-cache: a boolean flag takes its value as --fetch-cache=false`) {
		t.Errorf("serve --fetch-cache off: exit %d\n%s", code, stderr)
	}
}

// TestNoDataNeverCreated: only serve and init create a data directory.
// Every other command on a missing one (a typo, the default from another
// directory) fails with one message and exit 2, creating nothing.
func TestNoDataNeverCreated(t *testing.T) {
	cwd := t.TempDir()
	missing := filepath.Join(t.TempDir(), "nonexistent", "dir")
	wantMsg := func(dir string) string {
		return "packwire: no packwire data in " + dir + " (start packwire serve --data " + dir + " first, or pass --data)\n"
	}
	checked := 0
	for _, words := range leaves() {
		name := strings.Join(words, " ")
		help, _, _ := pw(t, "", nil, append(words, "--help")...)
		if !strings.Contains(help, "  --data DIR") || name == "serve" || name == "init" || name == "bench" || name == "restore" {
			continue // bench writes reports only, under --out if given; restore makes a new one
		}
		checked++
		for _, args := range [][]string{append(words[:len(words):len(words)], "--data", missing), words} {
			stdout, stderr, code := pw(t, cwd, nil, args...)
			dir := missing
			if len(args) == len(words) {
				dir = filepath.Join(cwd, "packwire-data") // the default, made absolute
			}
			if code != 2 || stderr != wantMsg(dir) || stdout != "" {
				t.Errorf("packwire %s: exit %d, stdout %q, stderr %q; want 2 and %q", strings.Join(args, " "), code, stdout, stderr, wantMsg(dir))
			}
		}
	}
	if checked < 15 {
		t.Fatalf("only %d commands take --data?", checked)
	}
	if _, err := os.Stat(filepath.Dir(missing)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a command created %s", filepath.Dir(missing))
	}
	if entries, _ := os.ReadDir(cwd); len(entries) != 0 {
		t.Fatalf("a command created %v in its working directory", entries)
	}
	// A relative --data is named absolute.
	if _, stderr, _ := pw(t, cwd, nil, "repo", "list", "--data", "typo"); stderr != wantMsg(filepath.Join(cwd, "typo")) {
		t.Errorf("repo list --data typo: %q", stderr)
	}

	// $PACKWIRE_DATA is every command's default, serve's included.
	data := filepath.Join(t.TempDir(), "env-data")
	env := []string{"PACKWIRE_DATA=" + data}
	if _, stderr, code := pw(t, cwd, env, "user", "list"); code != 2 || stderr != wantMsg(data) {
		t.Errorf("user list with PACKWIRE_DATA of a missing directory: exit %d %q", code, stderr)
	}
	if out, _, code := pw(t, cwd, env, "init"); code != 0 || !strings.Contains(out, "created packwire data in "+data) {
		t.Fatalf("init with PACKWIRE_DATA: exit %d %q", code, out)
	}
	if out, _, code := pw(t, cwd, env, "init"); code != 0 || !strings.Contains(out, "already holds packwire data") {
		t.Fatalf("init again: exit %d %q", code, out)
	}
	if out, stderr, code := pw(t, cwd, env, "user", "add", "zed"); code != 0 || out != "user zed added\n" {
		t.Fatalf("user add with PACKWIRE_DATA: exit %d %q %q", code, out, stderr)
	}
	if out, _, _ := pw(t, "", nil, "user", "list", "--data", data); out != "zed\n" {
		t.Fatalf("the user went elsewhere: %q", out)
	}
	if help, _, _ := pw(t, "", env, "serve", "--help"); !strings.Contains(help, "(default "+data+")") {
		t.Errorf("serve --help does not take its --data default from PACKWIRE_DATA")
	}
	if entries, _ := os.ReadDir(cwd); len(entries) != 0 {
		t.Fatalf("a command created %v in its working directory", entries)
	}
}

// TestErrorsNameWhatIsWrong: errors say which user, which value, which
// flag, which operation.
func TestErrorsNameWhatIsWrong(t *testing.T) {
	data := newData(t)
	key := filepath.Join(t.TempDir(), "id.pub")
	os.WriteFile(key, []byte("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBfCe2DAk0Cfp5PnTQw9jhHcHShtEzUi2F2Pnbcy1uWl a@b\n"), 0o644)
	pw(t, "", nil, "user", "add", "alice", "--data", data)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"key", "add", "zed", key}, 1, `key add: no user "zed"`},
		{[]string{"user", "remove", "zed"}, 1, `user remove: no user "zed"`},
		{[]string{"user", "add", "alice"}, 1, `user add: user "alice" already exists`},
		{[]string{"user", "add", "-bad"}, 2, `unknown flag --bad`},
		{[]string{"user", "add", ".bad"}, 2, `invalid user name ".bad"`},
		{[]string{"token", "create", "alice", "--expires", "30x"}, 2, `--expires 30x: a duration like 720h, 30m, 90s or 30d`},
		{[]string{"token", "revoke", "0123456789abcdef"}, 1, `no token with id 0123456789abcdef`},
		{[]string{"token", "list", "zed"}, 1, `token list: no user "zed"`},
		{[]string{"rule", "add", "allow", "pushh", "team/*", "refs/heads/*", "alice"}, 2, `rule add: unknown ref operation "pushh" (create, push, force-push, delete, all)`},
		{[]string{"rule", "add", "allow", "push", "team/*", "refs/heads/*", "alicee"}, 1, `rule add: no user "alicee"`},
		{[]string{"rule", "remove", "first"}, 2, `"first" is not a rule position`},
		{[]string{"revoke", "zed", "**"}, 1, `revoke: no user "zed"`},
		{[]string{"grant", "alice", "owner", "x"}, 2, `grant: unknown role "owner"`},
		{[]string{"anonymous-read", "maybe"}, 2, `"maybe" is not on or off`},
		{[]string{"repo", "create"}, 2, "missing arguments\nusage: packwire repo create NAME"},
		{[]string{"governor", "--by", "color"}, 2, "--by color: one of repo, user"},
		{[]string{"governor", "--since", "soon"}, 2, "--since soon: a duration like"},
	} {
		_, stderr, code := pw(t, "", nil, append(c.args, "--data", data)...)
		if code != c.code || !strings.Contains(stderr, c.want) {
			t.Errorf("packwire %s: exit %d, stderr %q; want %d and %q", strings.Join(c.args, " "), code, stderr, c.code, c.want)
		}
	}
	// Days are durations: a 30-day token.
	out, stderr, code := pw(t, "", nil, "token", "create", "alice", "--expires", "30d", "--data", data)
	if code != 0 {
		t.Fatalf("--expires 30d: exit %d %s", code, stderr)
	}
	m := regexp.MustCompile(`expires (\S+):`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("token create --expires 30d: %q", out)
	}
	if exp, err := time.Parse(time.RFC3339, m[1]); err != nil || exp.Sub(time.Now()) < 29*24*time.Hour || exp.Sub(time.Now()) > 31*24*time.Hour {
		t.Fatalf("--expires 30d expires at %s", m[1])
	}
	// TLS halves, checked before anything is created.
	fresh := filepath.Join(t.TempDir(), "fresh")
	for args, want := range map[string]string{
		"--tls-cert c.pem":                 "--tls-cert given without --tls-key",
		"--tls-key k.pem":                  "--tls-key given without --tls-cert",
		"--tls-cert c.pem --tls-key k.pem": "--tls-cert: open c.pem: no such file",
		"--log-format xml":                 "--log-format xml: text or json",
		"--trusted-proxies 10.0.0.0/33":    `--trusted-proxies: "10.0.0.0/33" is neither an address nor a CIDR prefix`,
	} {
		_, stderr, code := pw(t, t.TempDir(), nil, append([]string{"serve", "--data", fresh, "--git", "127.0.0.1:0", "--http", "127.0.0.1:0", "--ssh", "127.0.0.1:0"}, strings.Fields(args)...)...)
		if code == 0 || !strings.Contains(stderr, want) {
			t.Errorf("serve %s: exit %d, stderr %q; want %q", args, code, stderr, want)
		}
	}
	if _, err := os.Stat(fresh); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("serve with bad flags created its data directory")
	}
}

// TestRootInServiceUsersData: as root, admin commands refuse a data
// directory the service user owns, naming the user to run them as, since
// what they would create there would be root's.
func TestRootInServiceUsersData(t *testing.T) {
	if os.Geteuid() != 0 {
		needs.Missing(t, "this test needs root (scripts/test as root)")
	}
	data := newData(t)
	if err := filepath.Walk(data, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, 65534, 65534)
	}); err != nil {
		t.Fatal(err)
	}
	_, stderr, code := pw(t, "", nil, "repo", "create", "team/app", "--data", data)
	if code != 1 || !regexp.MustCompile(`belongs to user \S+: run admin commands as that user \(sudo -u \S+ packwire \.\.\.\)`).MatchString(stderr) {
		t.Fatalf("repo create as root in another user's data: exit %d %q", code, stderr)
	}
	if _, err := os.Stat(filepath.Join(data, "repos", "team")); err == nil {
		t.Fatal("it created the repository anyway")
	}
}
