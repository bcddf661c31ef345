package pipeline

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"packwire/internal/gitexec"
	"packwire/internal/protocol"
	"packwire/internal/repostate"
)

// capabilitiesCache keeps protocol v2 capability advertisements by
// repository. Over smart HTTP a v2 client's GET of info/refs gets nothing
// but that advertisement, which depends only on git's version and
// configuration, yet cost a git process per request: half the server CPU
// of a no-op fetch. The cache serves it without spawning git until the
// repository's or a global config file changes. An advertisement with a
// session id (transfer.advertiseSID) is per process and never cached.
type capabilitiesCache struct {
	mu      sync.Mutex
	entries map[string]capabilitiesEntry // by repository path
}

type capabilitiesEntry struct {
	stamp string // repostate.Config's digest when read
	body  []byte
}

// maxCapabilities bounds what is kept per repository: an advertisement is
// a few hundred bytes; anything larger is not one.
const maxCapabilities = 16 << 10

// cachesCapabilities tells whether a request is a stateless v2
// capability advertisement (HTTP GET info/refs with version=2).
func cachesCapabilities(req Request) bool {
	return req.Service == gitexec.UploadPack && req.AdvertiseRefs && req.StatelessRPC &&
		protocol.Version(req.Protocol) == 2
}

func (c *capabilitiesCache) get(repoPath, stamp string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[repoPath]
	return e.body, ok && e.stamp == stamp
}

func (c *capabilitiesCache) put(repoPath, stamp string, body []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil {
		c.entries = map[string]capabilitiesEntry{}
	}
	c.entries[repoPath] = capabilitiesEntry{stamp: stamp, body: body}
}

// runCapabilities answers a v2 capability advertisement from the cache,
// or runs git and keeps its answer for the next request.
func (c *Call) runCapabilities(ctx context.Context, spec gitexec.Spec, stdin io.Reader, stdout, stderr io.Writer) (gitexec.Result, error) {
	p := c.p
	st := repostate.Config(c.Repo.Path, time.Now())
	stamp := st.Digest
	if body, ok := p.capabilities.get(c.Repo.Path, stamp); ok && !st.Racy {
		n, err := stdout.Write(body)
		if spec.Progress != nil {
			spec.Progress.BytesOut.Add(int64(n))
		}
		if err != nil {
			return gitexec.Result{BytesOut: int64(n)}, fmt.Errorf("%w: %v", gitexec.ErrClientGone, err)
		}
		return gitexec.Result{BytesOut: int64(n)}, nil
	}
	capture := &capturingWriter{w: stdout}
	res, err := p.Runner.Run(ctx, spec, stdin, capture, stderr)
	if err == nil && res.ExitCode == 0 && !st.Racy && !capture.overflow && bytes.HasSuffix(capture.buf.Bytes(), []byte("0000")) &&
		!bytes.Contains(capture.buf.Bytes(), []byte("session-id=")) {
		p.capabilities.put(c.Repo.Path, stamp, bytes.Clone(capture.buf.Bytes()))
	}
	return res, err
}

// capturingWriter passes writes through and keeps a copy of up to
// maxCapabilities bytes.
type capturingWriter struct {
	w        io.Writer
	buf      bytes.Buffer
	overflow bool
}

func (c *capturingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	if c.buf.Len()+n > maxCapabilities {
		c.overflow = true
	} else {
		c.buf.Write(p[:n])
	}
	return n, err
}
