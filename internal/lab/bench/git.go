package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"packwire/internal/procgroup"
)

// client runs the real git client in an isolated environment: its own
// HOME, no system config, no prompts, and the study's settings on every
// command line (-c gc.auto=0, -c protocol.version=N).
type client struct {
	git     string
	env     []string
	config  []string // "-c", "k=v" pairs
	secrets []string // redacted from every message we keep
}

// passedEnv are the variables of the caller's environment a client keeps:
// how to find programs, reach the network and authenticate over SSH.
var passedEnv = []string{
	"PATH", "SSH_AUTH_SOCK", "GIT_SSH", "GIT_SSH_COMMAND", "GIT_SSL_CAINFO", "GIT_SSL_NO_VERIFY",
	"http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
	"SystemRoot", "SYSTEMROOT", "TEMP", "TMP", "TMPDIR", "ComSpec", "PATHEXT", "USERPROFILE",
}

func newClient(gitPath, home string, protocol int, secrets []string) (*client, error) {
	if err := os.MkdirAll(home, 0o755); err != nil {
		return nil, err
	}
	env := []string{
		"HOME=" + home,
		"XDG_CONFIG_HOME=" + filepath.Join(home, ".config"),
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_TERMINAL_PROMPT=0",
		"GIT_ASKPASS=", "SSH_ASKPASS=",
		"LANG=C", "LC_ALL=C",
		"GIT_AUTHOR_NAME=packwire bench", "GIT_AUTHOR_EMAIL=bench@packwire.invalid",
		"GIT_COMMITTER_NAME=packwire bench", "GIT_COMMITTER_EMAIL=bench@packwire.invalid",
	}
	for _, k := range passedEnv {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	if runtime.GOOS == "windows" {
		env = append(env, "USERPROFILE="+home)
	}
	c := &client{git: gitPath, env: env, secrets: secrets}
	c.config = []string{"-c", "gc.auto=0", "-c", fmt.Sprintf("protocol.version=%d", protocol)}
	return c, nil
}

// result is what one git command did.
type result struct {
	Stdout string
	Stderr string
	Wall   time.Duration
	CPU    time.Duration // user+system of git and the children it waited for
	Bytes  int64         // pack bytes received, when a pack trace was asked for; else -1
	Err    error
}

// run runs git in dir. With packTrace set, git writes every pack it
// receives (the clone's or fetch's, and those of the lazy fetches a
// partial clone makes) verbatim to that file (GIT_TRACE_PACKFILE); its
// size is the pack bytes received and the file is removed.
func (c *client) run(ctx context.Context, dir, packTrace string, args ...string) result {
	argv := append(append([]string{}, c.config...), args...)
	cmd := exec.CommandContext(ctx, c.git, argv...)
	cmd.Dir = dir
	cmd.Env = c.env
	if packTrace != "" {
		os.Remove(packTrace)
		cmd.Env = append(append([]string{}, c.env...), "GIT_TRACE_PACKFILE="+packTrace)
	}
	var stdout bytes.Buffer
	stderr := &tailBuffer{max: 16 << 10}
	cmd.Stdout = &stdout
	cmd.Stderr = stderr
	// git runs in its own process group, so that a cancelled operation
	// takes its children (index-pack, remote helpers) along.
	cmd.Cancel = func() error { procgroup.Kill(cmd); return nil }
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	err := procgroup.Start(cmd)
	if err == nil {
		err = cmd.Wait()
	}
	r := result{Wall: time.Since(start), Stdout: stdout.String(), Stderr: c.redact(stderr.String()), Bytes: -1}
	if cmd.ProcessState != nil {
		r.CPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	if packTrace != "" {
		r.Bytes = 0
		if fi, statErr := os.Stat(packTrace); statErr == nil {
			r.Bytes = fi.Size()
		}
		os.Remove(packTrace)
	}
	if err != nil {
		if ctx.Err() != nil {
			r.Err = ctx.Err()
		} else {
			r.Err = fmt.Errorf("git %s: %s", args[0], c.describe(err, r.Stderr))
		}
	}
	return r
}

// output runs a quick git command and returns its trimmed stdout.
func (c *client) output(ctx context.Context, dir string, args ...string) (string, error) {
	r := c.run(ctx, dir, "", args...)
	return strings.TrimSpace(r.Stdout), r.Err
}

// describe is git's own message for a failure: the last lines of stderr.
func (c *client) describe(err error, stderr string) string {
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		return c.redact(err.Error())
	}
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	var keep []string
	for i := len(lines) - 1; i >= 0 && len(keep) < 3; i-- {
		if l := strings.TrimSpace(lines[i]); l != "" {
			keep = append([]string{l}, keep...)
		}
	}
	msg := strings.Join(keep, " / ")
	if msg == "" {
		msg = exit.String()
	}
	if len(msg) > 500 {
		msg = msg[:500] + "..."
	}
	return msg
}

func (c *client) redact(s string) string {
	for _, secret := range c.secrets {
		if secret != "" {
			s = strings.ReplaceAll(s, secret, "***")
		}
	}
	return s
}

// tailBuffer keeps the last max bytes written: git's message is at the end.
type tailBuffer struct {
	buf []byte
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return string(t.buf) }

// RedactURL hides the password of a URL's user info, for reports and logs.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "***")
		return strings.Replace(u.String(), "%2A%2A%2A", "***", 1)
	}
	return raw
}

// urlSecret is the password in a URL's user info, if any.
func urlSecret(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return ""
	}
	p, _ := u.User.Password()
	return p
}
