package pipeline

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"packwire/internal/gitexec"
	"packwire/internal/governor"
	"packwire/internal/maintain"
	"packwire/internal/pktline"
)

// KindBundle is the governor's kind for a download of a clone bundle.
const KindBundle = "bundle"

// BundleSuffix is the URL path of a repository's clone bundle after the
// repository's own ("/NAME.git" + BundleSuffix), served over HTTP.
const BundleSuffix = "/bundle"

// ErrNoBundle: the repository has no clone bundle (not maintained yet,
// nothing to clone, or served by another node).
var ErrNoBundle = errors.New("no clone bundle")

// ServeBundle hands the repository's clone bundle (maintain.BundleFile)
// to serve, which sends it and returns the bytes sent, and records the
// request (kind KindBundle, no git, no limiter slot: a static file). The
// call must have been prepared as a read (an upload-pack advertisement).
// A repository without one is CodeNotFound.
func (c *Call) ServeBundle(serve func(f *os.File, fi os.FileInfo) (int64, error)) error {
	defer c.releaseWG()
	rec := c.record()
	rec.Kind = KindBundle
	defer func() {
		rec.Wall = governor.Duration(time.Since(c.started))
		c.p.finish(&rec)
	}()
	var f *os.File
	var err error
	if c.route.Relay == nil && c.Repo.Path != "" {
		f, err = os.Open(filepath.Join(c.Repo.Path, maintain.BundleFile))
	} else {
		err = ErrNoBundle
	}
	if err != nil {
		rec.Result, rec.Error = governor.ResultRefused, ErrNoBundle.Error()
		return &Error{Code: CodeNotFound, Message: "no clone bundle for '" + c.Repo.Name + "' (written by its next full maintenance run)", Err: ErrNoBundle}
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		rec.Result, rec.Error = governor.ResultRefused, err.Error()
		return &Error{Code: CodeInternal, Message: "internal error reading the clone bundle", Err: err}
	}
	rec.BytesOut, err = serve(f, fi)
	rec.Result = governor.ResultOK
	if err != nil {
		rec.Result, rec.Error = governor.ResultClientGone, err.Error()
	}
	return err
}

// bundleURI is the absolute URL of the repository's clone bundle that a
// v2 client is told of, or "" when none is advertised: bundle URIs off,
// no bundle, no base URL (PublicURL; else over HTTP the address the
// client used, over git:// and SSH the HTTP listener's), or a session git
// answers (it would refuse the command).
func (c *Call) bundleURI() string {
	p, req := c.p, c.Request
	if !p.BundleURIs || req.Service != gitexec.UploadPack || c.route.Relay != nil || c.Repo.Path == "" {
		return ""
	}
	if !req.StatelessRPC && !c.servesV2Session() {
		return ""
	}
	base := p.PublicURL
	if base == "" {
		base = req.BaseURL
	}
	if base == "" {
		base = p.ListenerURL
	}
	if base == "" {
		return ""
	}
	if _, err := os.Stat(filepath.Join(c.Repo.Path, maintain.BundleFile)); err != nil {
		return ""
	}
	return strings.TrimSuffix(base, "/") + "/" + c.Repo.Name + ".git" + BundleSuffix
}

// isBundleURICommand tells a v2 request whose first packet is
// "command=bundle-uri".
func isBundleURICommand(first string) bool {
	return strings.TrimSuffix(first, "\n") == "command=bundle-uri"
}

// answerBundleURI answers the v2 bundle-uri command (gitprotocol-v2):
// one bundle, the whole clone, at uri; a flush alone when there is none.
// git's clients (2.40+ with transfer.bundleURI) fetch it, then fetch
// what it lacks from here.
func answerBundleURI(uri string) []byte {
	var out []byte
	if uri != "" {
		for _, kv := range []string{"bundle.version=1", "bundle.mode=all", "bundle.packwire.uri=" + uri} {
			out, _ = pktline.Append(out, []byte(kv+"\n"))
		}
	}
	return append(out, "0000"...)
}

// bundleCapability is the advertisement's packet for the command.
var bundleCapability = func() []byte { b, _ := pktline.Append(nil, []byte("bundle-uri\n")); return b }()

// runBundleURI answers a whole bundle-uri command (body) without git,
// which (2.39) does not know it: the bundle's URL when one is advertised,
// else what git would say of a command it does not serve.
func (c *Call) runBundleURI(body *requestBody, stdout io.Writer) (gitexec.Result, error) {
	defer body.close()
	res := gitexec.Result{BytesIn: body.size}
	uri := c.bundleURI()
	if uri == "" {
		perr := &Error{Code: CodeBadRequest, Message: "invalid command 'bundle-uri'", Err: ErrNoBundle}
		pktline.WriteError(stdout, perr.Message)
		return res, perr
	}
	n, err := stdout.Write(answerBundleURI(uri))
	res.BytesOut = int64(n)
	if err != nil {
		err = errors.Join(gitexec.ErrClientGone, err)
	}
	return res, err
}
