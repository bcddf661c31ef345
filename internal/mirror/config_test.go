package mirror

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"packwire/internal/repo"
)

// The config reader must read what git config writes, quoting and
// escapes included: a push mirror's URL is read on every push.
func TestReadConfigAsGitWritesIt(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "r.git")
	run := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+t.TempDir())
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	run("init", "-q", "--bare", dir)
	set := func(k, v string) { run("--git-dir="+dir, "config", k, v) }
	set("remote.origin.url", "https://host/x.git")
	set("packwire.pullMirror", "origin")
	set("packwire.mirrorInterval", "90s")
	set("remote.packwire-push-2.url", "https://h/a b;c#d")
	set("remote.packwire-push-1.url", ` spaced "quoted" \ back`)
	set("remote.packwire-push-x.url", "https://ignored")
	c, err := ReadConfig(repo.Repo{Name: "r", Path: dir})
	if err != nil {
		t.Fatal(err)
	}
	if !c.IsPullMirror() || c.PullURL != "https://host/x.git" || c.Interval != 90*time.Second {
		t.Fatalf("pull mirror: %+v", c)
	}
	if len(c.Pushes) != 2 || c.Pushes[0].ID != 1 || c.Pushes[0].URL != ` spaced "quoted" \ back` || c.Pushes[1].URL != "https://h/a b;c#d" {
		t.Fatalf("push mirrors: %+v", c.Pushes)
	}
	if msg := ReadOnlyRefusal(repo.Repo{Name: "r", Path: dir}); msg != "repository 'r' is a read-only mirror of https://host/x.git; push there instead" {
		t.Fatalf("refusal: %q", msg)
	}
}

func TestParseValue(t *testing.T) {
	for in, want := range map[string]string{
		` plain value  `:         "plain value",
		`value # comment`:        "value",
		`"quoted ; kept" ; gone`: "quoted ; kept",
		`a\tb\\c\"d`:             "a\tb\\c\"d",
		`"  inner  "  `:          "  inner  ",
	} {
		if got := parseValue(in); got != want {
			t.Errorf("parseValue(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSplitURLAndRedact(t *testing.T) {
	clean, creds, err := SplitURL("https://bob:s3cr%2Ft@example.com:8443/team/app.git?x=1")
	if err != nil || clean != "https://example.com:8443/team/app.git?x=1" || creds.Username != "bob" || creds.Password != "s3cr/t" {
		t.Fatalf("split: %q %+v %v", clean, creds, err)
	}
	if got := Redact("https://bob:s3cret@example.com/a?token=abc"); got != "https://***@example.com/a?***" {
		t.Fatalf("redact: %q (*** as written, not %%2A%%2A%%2A)", got)
	}
	if got := Redact("ssh://git@example.com/a"); got != "ssh://git@example.com/a" {
		t.Fatalf("ssh user is no secret: %q", got)
	}
	for _, bad := range []string{"ext::sh -c evil", "ftp://example.com/a", "ssh://u:pw@example.com/a", "", "fd::3"} {
		if _, _, err := SplitURL(bad); err == nil {
			t.Errorf("SplitURL(%q) accepted", bad)
		}
	}
	for _, ok := range []string{"git@example.com:team/app.git", "/srv/git/app.git", "file:///srv/app.git", "git://example.com/app"} {
		if clean, creds, err := SplitURL(ok); err != nil || clean != ok || !creds.Empty() {
			t.Errorf("SplitURL(%q) = %q %+v %v", ok, clean, creds, err)
		}
	}
}

func TestScrub(t *testing.T) {
	c := Credentials{Username: "x-access-token", Password: "pwt_abc_def/ghi"}
	got := scrub("fatal: https://x-access-token:pwt_abc_def%2Fghi@h/ and pwt_abc_def/ghi", c)
	if strings.Contains(got, "pwt_abc") {
		t.Fatalf("scrub left the secret: %q", got)
	}
}
