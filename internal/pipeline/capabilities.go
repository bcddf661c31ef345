package pipeline

import (
	"bytes"
	"context"
	"io"
	"time"

	"packwire/internal/gitexec"
	"packwire/internal/protocol"
	"packwire/internal/repostate"
)

// cachesCapabilities tells whether a request is a stateless v2
// capability advertisement (HTTP GET info/refs with version=2).
//
// Over smart HTTP a v2 client's GET of info/refs gets nothing but that
// advertisement, which depends only on git's version and configuration,
// yet cost a git process per request: half the server CPU of a no-op
// fetch. The answer cache serves it without spawning git until the
// repository's or a global config file changes. An advertisement with a
// session id (transfer.advertiseSID) is per process and never kept.
func cachesCapabilities(req Request) bool {
	return req.Service == gitexec.UploadPack && req.AdvertiseRefs && req.StatelessRPC &&
		protocol.Version(req.Protocol) == 2
}

// cachesRefAdvertisement tells whether a request is a stateless v0/v1 ref
// advertisement (HTTP GET info/refs of upload-pack without version=2):
// the refs and capabilities, kept per repository state.
func cachesRefAdvertisement(req Request) bool {
	return req.Service == gitexec.UploadPack && req.AdvertiseRefs && req.StatelessRPC &&
		protocol.Version(req.Protocol) != 2
}

// runCapabilities answers a v2 capability advertisement (spec: a
// stateless --advertise-refs run) from the answer cache, or runs git and
// keeps its answer for the next request.
func (c *Call) runCapabilities(ctx context.Context, spec gitexec.Spec, stdout, stderr io.Writer) (gitexec.Result, error) {
	st := repostate.Config(c.Repo.Path, time.Now())
	noSession := func(b []byte) bool { return !bytes.Contains(b, []byte("session-id=")) }
	return c.cachedAnswer(ctx, "capabilities", spec, st, nil, nil, noSession, stdout, stderr)
}

// runRefAdvertisement answers a v0/v1 ref advertisement (a stateless
// --advertise-refs run) from the answer cache for the repository's
// current refs, or runs git and keeps its answer.
func (c *Call) runRefAdvertisement(ctx context.Context, spec gitexec.Spec, stdout, stderr io.Writer) (gitexec.Result, error) {
	st, err := repostate.Refs(c.Repo.Path, time.Now())
	if err != nil {
		st = repostate.Stamp{}
	}
	noSession := func(b []byte) bool { return !bytes.Contains(b, []byte("session-id=")) }
	return c.cachedAnswer(ctx, "advertisement", spec, st, nil, nil, noSession, stdout, stderr)
}

// runLsRefs answers a v2 ls-refs command (body, whole; spec a stateless
// run) from the answer cache for the repository's current refs, or runs
// git and keeps its answer. key is the command without the client's agent.
func (c *Call) runLsRefs(ctx context.Context, spec gitexec.Spec, body, key []byte, stdout, stderr io.Writer) (gitexec.Result, error) {
	st, err := repostate.Refs(c.Repo.Path, time.Now())
	if err != nil {
		st = repostate.Stamp{}
	}
	return c.cachedAnswer(ctx, "ls-refs", spec, st, body, key, nil, stdout, stderr)
}
