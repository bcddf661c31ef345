package http

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"

	"packwire/internal/access"
	"packwire/internal/gitexec"
	"packwire/internal/pipeline"
)

// principal turns the request's credentials into a principal, or answers
// the request itself (401 for bad ones, 503 when the store cannot say)
// and returns false.
func (h *Handler) principal(w http.ResponseWriter, r *http.Request, repoPath string) (access.Principal, bool) {
	user, token, hasAuth := r.BasicAuth()
	if !hasAuth {
		return access.Anonymous, true
	}
	p, err := h.Access.PrincipalForToken(r.Context(), user, token)
	if err == nil {
		return p, true
	}
	if !errors.Is(err, access.ErrBadCredentials) {
		// The store could not answer (a database restarting, say):
		// not the client's credentials, so no 401, which git would
		// report as "Authentication failed" and credential helpers
		// would act on.
		h.log().Warn("checking credentials", "transport", "http", "remote", r.RemoteAddr, "repo", repoPath, "error", err.Error())
		writePipelineError(w, pipeline.StoreUnavailable(err))
		return access.Principal{}, false
	}
	h.log().Info("refused", "transport", "http", "remote", r.RemoteAddr, "repo", repoPath, "reason", err.Error())
	w.Header().Set("WWW-Authenticate", realm)
	plainError(w, http.StatusUnauthorized, "invalid credentials: use a packwire token as the password")
	return access.Principal{}, false
}

// baseURL is the scheme and host the client reached this server at.
func baseURL(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// serveBundle answers GET or HEAD /NAME.git/bundle with the repository's
// clone bundle, under the repository's read access (anonymous where it
// allows), as a static file: ETag, Last-Modified, conditional and Range
// requests (http.ServeContent), and sendfile from the file to the socket
// (ServeContent copies the *os.File into the ResponseWriter's ReadFrom;
// countingWriter passes that on).
func (h *Handler) serveBundle(w http.ResponseWriter, r *http.Request, repoPath string) {
	if !h.Pipeline.BundleURIs {
		plainError(w, http.StatusNotFound, "not found")
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		methodNotAllowed(w, "GET")
		return
	}
	principal, ok := h.principal(w, r, repoPath)
	if !ok {
		return
	}
	call, err := h.Pipeline.Prepare(r.Context(), pipeline.Request{
		Transport: "http", Service: gitexec.UploadPack, RepoPath: repoPath, Principal: principal,
		Remote: r.RemoteAddr, StatelessRPC: true, AdvertiseRefs: true, // a read that generates nothing
	})
	if err != nil {
		writePipelineError(w, err)
		return
	}
	err = call.ServeBundle(func(f *os.File, fi os.FileInfo) (int64, error) {
		hd := w.Header()
		// The file is replaced by rename, never rewritten: its mtime and
		// size name its content (as nginx's ETag does).
		hd.Set("ETag", fmt.Sprintf(`"%x-%x"`, fi.ModTime().UnixNano(), fi.Size()))
		hd.Set("Content-Type", "application/x-git-bundle")
		hd.Set("Cache-Control", "no-cache") // revalidate: the next full run replaces it
		cw := &countingWriter{ResponseWriter: w}
		http.ServeContent(cw, r, "bundle", fi.ModTime(), f)
		return cw.n, cw.err
	})
	var perr *pipeline.Error
	if errors.As(err, &perr) {
		writePipelineError(w, err)
	}
}

// countingWriter counts the body bytes sent and keeps the first write
// error (ServeContent does not return it; the request's context is no
// witness: it ends when the client closes after the last byte), and keeps
// the ResponseWriter's ReadFrom (sendfile) visible to io.Copy.
type countingWriter struct {
	http.ResponseWriter
	n   int64
	err error
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n += int64(n)
	c.err = cmp.Or(c.err, err)
	return n, err
}

func (c *countingWriter) ReadFrom(r io.Reader) (int64, error) {
	var n int64
	var err error
	if rf, ok := c.ResponseWriter.(io.ReaderFrom); ok {
		n, err = rf.ReadFrom(r)
	} else {
		n, err = io.Copy(struct{ io.Writer }{c.ResponseWriter}, r)
	}
	c.n += n
	c.err = cmp.Or(c.err, err)
	return n, err
}
