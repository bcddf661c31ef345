package rtt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"packwire/internal/lab/netem"
)

// Reuse is how connections are reused between and within git commands.
type Reuse string

const (
	// ReuseNone: every git command opens its own connection (git://
	// always; SSH with ControlMaster=no), and over HTTP every request
	// does (git sends "Connection: close", so the server closes each).
	ReuseNone Reuse = "none"
	// ReuseControlMaster: SSH commands are sessions on one OpenSSH master
	// connection (ControlMaster=auto, ControlPersist), opened before the
	// measurement; the master goes through the proxy too.
	ReuseControlMaster Reuse = "controlmaster"
	// ReuseKeepAlive: HTTP keeps its connection open within one git
	// command (what git does by itself); a new command opens a new one.
	ReuseKeepAlive Reuse = "keep-alive"
)

// ReusesFor lists the reuse variants that exist for a transport.
func ReusesFor(transport string) []Reuse {
	switch transport {
	case SSH:
		return []Reuse{ReuseNone, ReuseControlMaster}
	case HTTP, HTTPS:
		return []Reuse{ReuseKeepAlive, ReuseNone}
	}
	return []Reuse{ReuseNone}
}

// Op is one git operation to measure.
type Op struct {
	Name  string   `json:"name"`            // label: ls-remote, fetch, clone, clone --depth 1, ...
	Kind  string   `json:"kind"`            // KindLsRemote, KindFetch or KindClone
	Clone []string `json:"clone,omitempty"` // extra git clone arguments
	// Checkout: after the clone (made with --no-checkout) time a checkout
	// of HEAD separately, through the same proxy (a partial clone fetches
	// what it misses then).
	Checkout bool `json:"checkout,omitempty"`
}

// Kinds of Op.
const (
	KindLsRemote = "ls-remote"
	KindFetch    = "fetch" // a fetch with nothing new, into a prepared full clone
	KindClone    = "clone"
)

// The operations rtt measures by default.
var (
	LsRemote   = Op{Name: "ls-remote", Kind: KindLsRemote}
	NoopFetch  = Op{Name: "no-op fetch", Kind: KindFetch}
	SmallClone = Op{Name: "clone --depth 1", Kind: KindClone, Clone: []string{"--depth", "1"}}
)

// Sample is one run of an Op.
type Sample struct {
	Wall          time.Duration `json:"wall"`
	Usage         netem.Usage   `json:"usage"`
	CheckoutWall  time.Duration `json:"checkout_wall,omitempty"`
	CheckoutUsage netem.Usage   `json:"checkout_usage,omitzero"`
}

// Client is how git and ssh are run: their environment, the SSH identity
// and options, and a scratch directory.
type Client struct {
	Git        string   // git binary (default "git")
	Env        []string // environment of git and ssh (default: this process's)
	SSHKey     string   // private key for SSH (-i), if not the user's default
	SSHOptions []string // extra ssh -o options, e.g. "Ciphers=aes128-gcm@openssh.com"
	// Dir is a scratch directory the client owns: clones, the known_hosts
	// it builds (accept-new), control sockets. Required.
	Dir string

	mu       sync.Mutex
	prepared map[string]string // URL -> full clone for no-op fetches
	origins  map[string]string // prepared clone -> the URL its origin is set to
	seq      int
}

func (c *Client) next() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	return c.seq
}

// sshCommand is GIT_SSH_COMMAND for the given extra options.
func (c *Client) sshCommand(extra ...string) string {
	words := append([]string{"ssh"}, extra...)
	words = append(words, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new",
		"-o", "UserKnownHostsFile="+filepath.Join(c.Dir, "known_hosts"), "-o", "LogLevel=ERROR")
	if c.SSHKey != "" {
		words = append(words, "-o", "IdentitiesOnly=yes", "-i", c.SSHKey)
	}
	for _, o := range c.SSHOptions {
		words = append(words, "-o", o)
	}
	quoted := make([]string, len(words))
	for i, w := range words {
		quoted[i] = shellQuote(w)
	}
	return strings.Join(quoted, " ")
}

// shellQuote quotes a word for the shell git runs GIT_SSH_COMMAND with.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_=./:@%+,", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// git runs one git command; the error carries the end of its output.
func (c *Client) git(ctx context.Context, dir string, sshCommand string, args ...string) (time.Duration, error) {
	bin := c.Git
	if bin == "" {
		bin = "git"
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	env := c.Env
	if env == nil {
		env = os.Environ()
	}
	cmd.Env = append(append([]string{}, env...), "GIT_TERMINAL_PROMPT=0", "GIT_SSH_VARIANT=ssh", "GIT_SSH_COMMAND="+sshCommand)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// An SSH master in the background must not hold the command open.
	cmd.WaitDelay = 2 * time.Second
	start := time.Now()
	err := cmd.Run()
	wall := time.Since(start)
	if err != nil {
		return wall, fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, lastLines(out.String(), 4))
	}
	return wall, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// prepare makes (once per URL) the full clone no-op fetches go into,
// straight from the server, not through any proxy.
func (c *Client) prepare(ctx context.Context, t Target) (string, error) {
	c.mu.Lock()
	dir, ok := c.prepared[t.URL]
	c.mu.Unlock()
	if ok {
		return dir, nil
	}
	dir = filepath.Join(c.Dir, fmt.Sprintf("fetch-%d", c.next()))
	if _, err := c.git(ctx, c.Dir, c.sshCommand("-o", "ControlMaster=no", "-o", "ControlPath=none"), "clone", "-q", "--no-checkout", t.URL, dir); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("preparing a clone for the no-op fetch: %w", err)
	}
	c.mu.Lock()
	if c.prepared == nil {
		c.prepared = map[string]string{}
	}
	c.prepared[t.URL] = dir
	c.mu.Unlock()
	return dir, nil
}

// setOrigin points the prepared clone's origin at url (a session's proxy),
// unless it already points there: once per session, not once per fetch.
func (c *Client) setOrigin(ctx context.Context, dir, url, sshCommand string) error {
	c.mu.Lock()
	set := c.origins[dir] == url
	c.mu.Unlock()
	if set {
		return nil
	}
	if _, err := c.git(ctx, dir, sshCommand, "remote", "set-url", "origin", url); err != nil {
		return err
	}
	c.mu.Lock()
	if c.origins == nil {
		c.origins = map[string]string{}
	}
	c.origins[dir] = url
	c.mu.Unlock()
	return nil
}

// Session runs git operations against one target through its own proxy,
// at one delay, with one way of reusing connections.
type Session struct {
	Target Target
	Reuse  Reuse
	Delay  time.Duration

	client      *Client
	proxy       *netem.Proxy
	url         string
	config      []string // git -c settings the proxied URL needs
	ssh         string   // GIT_SSH_COMMAND
	controlPath string
}

// Open starts a proxy toward t with the delay (a round-trip time) and,
// for ReuseControlMaster, opens the SSH master through it.
func (c *Client) Open(ctx context.Context, t Target, reuse Reuse, delay time.Duration) (*Session, error) {
	if c.Dir == "" {
		return nil, errors.New("rtt: Client.Dir is not set")
	}
	s := &Session{Target: t, Reuse: reuse, Delay: delay, client: c,
		proxy: &netem.Proxy{Upstream: t.DialAddr, Delay: delay}}
	addr, err := s.proxy.Start(ctx)
	if err != nil {
		return nil, err
	}
	s.url, s.config = t.Through(addr)
	if (t.Transport == HTTP || t.Transport == HTTPS) && reuse == ReuseNone {
		s.config = append(s.config, "http.extraHeader=Connection: close")
	}
	if t.Transport == SSH {
		opts := t.SSHOptions(addr)
		switch reuse {
		case ReuseControlMaster:
			s.controlPath = filepath.Join(c.Dir, "cm-"+strconv.Itoa(c.next()))
			opts = append(opts, "-o", "ControlMaster=auto", "-o", "ControlPath="+s.controlPath, "-o", "ControlPersist=60")
		default:
			opts = append(opts, "-o", "ControlMaster=no", "-o", "ControlPath=none")
		}
		s.ssh = c.sshCommand(opts...)
	}
	if reuse == ReuseControlMaster {
		// The first command opens the master; the measured ones reuse it.
		if _, err := c.git(ctx, c.Dir, s.ssh, append(s.configArgs(2), "ls-remote", s.url)...); err != nil {
			s.Close()
			return nil, fmt.Errorf("opening the SSH master connection: %w", err)
		}
	}
	return s, nil
}

// Close ends the SSH master, if any, and the proxy.
func (s *Session) Close() error {
	if s.controlPath != "" {
		cmd := exec.Command("ssh", "-o", "ControlPath="+s.controlPath, "-O", "exit", "packwire-rtt")
		cmd.Env = s.client.Env
		cmd.WaitDelay = time.Second
		cmd.Run() // no master (it failed to start) is fine
	}
	return s.proxy.Close()
}

// Run runs op once with the protocol version (0, 1 or 2) and returns its
// wall time and what went over the proxy.
func (s *Session) Run(ctx context.Context, op Op, protocol int) (Sample, error) {
	c := s.client
	args := s.configArgs(protocol)
	var sample Sample
	var err error
	switch op.Kind {
	case KindLsRemote:
		sample.Wall, sample.Usage, err = s.measure(ctx, c.Dir, append(args, "ls-remote", s.url))
	case KindFetch:
		dir, perr := c.prepare(ctx, s.Target)
		if perr != nil {
			return sample, perr
		}
		if err := c.setOrigin(ctx, dir, s.url, s.ssh); err != nil {
			return sample, err
		}
		sample.Wall, sample.Usage, err = s.measure(ctx, dir, append(args, "fetch", "-q", "origin"))
	case KindClone:
		dir := filepath.Join(c.Dir, fmt.Sprintf("clone-%d", c.next()))
		defer os.RemoveAll(dir)
		cloneArgs := append(append(append(args, "clone", "-q", "--no-checkout"), op.Clone...), s.url, dir)
		sample.Wall, sample.Usage, err = s.measure(ctx, c.Dir, cloneArgs)
		if err == nil && op.Checkout {
			sample.CheckoutWall, sample.CheckoutUsage, err = s.measure(ctx, dir, append(args, "checkout", "-q", "-f"))
		}
	default:
		return sample, fmt.Errorf("unknown operation kind %q", op.Kind)
	}
	return sample, err
}

// configArgs are the git -c arguments of every command of the session.
func (s *Session) configArgs(protocol int) []string {
	args := []string{"-c", "protocol.version=" + strconv.Itoa(protocol)}
	for _, kv := range s.config {
		args = append(args, "-c", kv)
	}
	return args
}

// measure runs one git command and returns its wall time and what it cost
// on the proxy, once the connections it opened have closed.
func (s *Session) measure(ctx context.Context, dir string, args []string) (time.Duration, netem.Usage, error) {
	before := s.proxy.Conns()
	wall, err := s.client.git(ctx, dir, s.ssh, args...)
	after := s.settle(len(before))
	return wall, netem.Delta(before, after), err
}

// settle waits until the connections opened after the first known ones
// are closed (their last bytes are still crossing the proxy when git
// exits), so their turns are not counted in the next command.
func (s *Session) settle(known int) []netem.ConnStats {
	deadline := time.Now().Add(2*time.Second + 4*s.Delay)
	for {
		conns := s.proxy.Conns()
		open := false
		for _, c := range conns[known:] {
			if c.Closed.IsZero() {
				open = true
			}
		}
		if !open || time.Now().After(deadline) {
			return conns
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// ResolveSSH asks ssh where an SSH target really goes (ssh -G reads
// ~/.ssh/config: a host alias, its HostName and Port) and sets DialAddr.
// Other targets are left alone. Without a usable answer DialAddr stays
// the URL's host and port.
func (c *Client) ResolveSSH(ctx context.Context, t *Target) {
	if t.Transport != SSH {
		return
	}
	args := []string{"-G"}
	if t.parsed != nil && t.parsed.Port() != "" {
		args = append(args, "-p", t.parsed.Port()) // else ~/.ssh/config may name the port
	}
	for _, o := range c.SSHOptions {
		args = append(args, "-o", o)
	}
	dest := t.Host
	if t.User != "" {
		dest = t.User + "@" + t.Host
	}
	cmd := exec.CommandContext(ctx, "ssh", append(args, "--", dest)...)
	cmd.Env = c.Env
	out, err := cmd.Output()
	if err != nil {
		return
	}
	host, port := t.Host, strconv.Itoa(t.Port)
	for _, line := range strings.Split(string(out), "\n") {
		key, value, _ := strings.Cut(strings.TrimSpace(line), " ")
		switch key {
		case "hostname":
			host = value
		case "port":
			port = value
		}
	}
	t.DialAddr = net.JoinHostPort(host, port)
}
