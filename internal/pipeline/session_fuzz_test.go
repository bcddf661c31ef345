package pipeline

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"packwire/internal/access"
	"packwire/internal/fetchcache"
	"packwire/internal/gitexec"
	"packwire/internal/needs"
	"packwire/internal/repo"
)

// fakeGit answers in process as upload-pack would in shape (an
// advertisement, then whatever the request), reading its stdin to the end:
// enough for the session loops to go round, at fuzzing speed.
func fakeGit(ctx context.Context, spec gitexec.Spec, stdin io.Reader, stdout, stderr io.Writer) (gitexec.Result, error) {
	out := stdout
	if spec.OutputFile != nil {
		out = spec.OutputFile
	}
	v2 := spec.Protocol == "version=2"
	write := func(s string) error {
		if out == nil {
			return nil
		}
		if _, err := io.WriteString(out, s); err != nil {
			return gitexec.ErrClientGone
		}
		return nil
	}
	switch {
	case spec.AdvertiseRefs && v2:
		return gitexec.Result{}, write("000eversion 2\n0013ls-refs=unborn\n0012fetch=shallow\n0000")
	case spec.AdvertiseRefs || !spec.StatelessRPC && !v2:
		if err := write("003f1111111111111111111111111111111111111111 refs/heads/main\n0000"); err != nil || spec.AdvertiseRefs {
			return gitexec.Result{}, err
		}
	}
	read := make(chan int64, 1)
	go func() { n, _ := io.Copy(io.Discard, stdin); read <- n }()
	select {
	case n := <-read:
		if n > 0 {
			return gitexec.Result{BytesIn: n}, write("0008NAK\n0000")
		}
		return gitexec.Result{}, nil // git ends quietly on an empty request
	case <-ctx.Done():
		return gitexec.Result{ExitCode: -1}, context.Cause(ctx)
	}
}

// fuzzClient is the client's side of a session as the pipeline sees it: its
// bytes in reads of at most chunk, then EOF; what the session writes is
// dropped. Over git:// (conn) it has a net.Conn's deadlines; over SSH, the
// output's write deadline only.
type fuzzClient struct {
	data  []byte
	chunk int
	reads atomic.Int64 // reads that delivered bytes
}

func (c *fuzzClient) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), c.chunk)], c.data)
	c.data = c.data[n:]
	c.reads.Add(1)
	return n, nil
}

type discardOutput struct{}

func (discardOutput) Write(p []byte) (int, error)      { return len(p), nil }
func (discardOutput) SetWriteDeadline(time.Time) error { return nil }

// gitConn is a git:// connection: reads, writes and both deadlines.
type gitConn struct {
	*fuzzClient
	discardOutput
}

func (gitConn) SetReadDeadline(time.Time) error { return nil }

var fuzzRepo = sync.OnceValues(func() (string, error) {
	dir, err := exec.Command("mktemp", "-d").Output()
	if err != nil {
		return "", err
	}
	path := filepath.Join(string(bytes.TrimSpace(dir)), "app.git")
	return path, exec.Command("git", "init", "-q", "--bare", path).Run()
})

// FuzzSessionGitStarts: whatever a client sends in a git:// or SSH
// upload-pack session, protocol v2 or v0, in whatever reads, the session
// starts at most one git per read that delivered new bytes (the request
// that opened it paying for the first), and it ends once its input has.
// The old v2 session started git in a loop on "zzzz".
func FuzzSessionGitStarts(f *testing.F) {
	for _, bad := range []string{"zzzz", "0003", "fff1", "ffff"} {
		f.Add([]byte(bad), byte(0<<2|1)) // v2 over git://
		f.Add([]byte(bad), byte(1<<2|3)) // v2 over SSH, a byte a read
		f.Add([]byte(bad), byte(0<<2|0)) // v0 over git://
	}
	lsRefs := pkts("command=ls-refs", "agent=git/2", "DELIM", "peel", "")
	fetch := pkts("command=fetch", "DELIM", "want 1111111111111111111111111111111111111111", "done", "")
	f.Add(append(append(lsRefs, fetch...), "0000"...), byte(0<<2|1))
	f.Add(append(lsRefs, "zzzz"...), byte(5<<2|3))
	f.Add(pkts("want 1111111111111111111111111111111111111111 multi_ack_detailed side-band-64k", "", "done"), byte(0<<2|0))
	f.Add(pkts("want 1111111111111111111111111111111111111111", "", "have 2222222222222222222222222222222222222222", "", "done"), byte(3<<2|2))
	f.Fuzz(func(t *testing.T, data []byte, mode byte) {
		path, err := fuzzRepo()
		if err != nil {
			needs.Missing(t, "no git to make a repository with (scripts/install-deps installs it): %v", err)
		}
		v2, overSSH, chunk := mode&1 != 0, mode&2 != 0, int(mode>>2)
		if chunk == 0 {
			chunk = max(len(data), 1)
		}
		cache := &fetchcache.Cache{Dir: t.TempDir(), MaxBytes: 1 << 20, GitVersion: "fuzz", Log: slog.New(slog.DiscardHandler)}
		if err := cache.Open(); err != nil {
			t.Fatal(err)
		}
		p := &Pipeline{
			Runner:     &gitexec.Runner{GitPath: "/nonexistent/git: only fakeGit runs", IdleTimeout: 5 * time.Second},
			Log:        slog.New(slog.DiscardHandler),
			FetchCache: cache,
			TempDir:    t.TempDir(),
			// Paced (v2 commands, v0 negotiation), never cut off here.
			RequestPace: Pace{Grace: time.Hour, MinRate: 1},
			spawn:       fakeGit,
		}
		p.initKillLocked()
		req := Request{Transport: "git", Service: gitexec.UploadPack, RepoPath: "app", Principal: access.Anonymous}
		if v2 {
			req.Protocol = "version=2"
		}
		client := &fuzzClient{data: bytes.Clone(data), chunk: chunk}
		var in io.Reader = gitConn{fuzzClient: client}
		var out, stderr io.Writer = gitConn{fuzzClient: client}, nil
		if overSSH {
			req.Transport = "ssh"
			in, out, stderr = client, discardOutput{}, io.Discard
		}
		c := &Call{p: p, Request: req, Repo: repo.Repo{Name: "app", Path: path}, ID: 1, started: time.Now(), releaseWG: func() {}, gated: true, timeouts: p.Timeouts()}
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			c.Run(context.Background(), in, out, stderr)
		}()
		select {
		case <-ended:
		case <-time.After(20 * time.Second):
			t.Fatalf("the session did not end 20s after its input did (git started %d times)", p.GitStarts())
		}
		if starts, reads := p.GitStarts(), client.reads.Load(); starts > 1+reads {
			t.Fatalf("git started %d times for %d reads of new bytes (and the request)", starts, reads)
		}
	})
}
