// Package http serves git's smart HTTP protocol (gitprotocol-http) as an
// http.Handler: GET .../info/refs?service=..., POST .../git-upload-pack and
// .../git-receive-pack, protocol v2 through the Git-Protocol header. It
// decodes gzip bodies within a bound, streams git's output as it is made and
// turns credentials into a principal; access and spawning stay in the pipeline.
package http

import (
	"compress/flate"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"packwire/internal/access"
	"packwire/internal/gitexec"
	"packwire/internal/pipeline"
	"packwire/internal/pktline"
	"packwire/internal/protocol"
)

// DefaultMaxRequestBody bounds a fetch request (wants and haves) after gzip
// decoding. A 5,000-ref mirror fetch is well under 1 MiB.
const DefaultMaxRequestBody = 64 << 20

// Handler is the smart HTTP endpoint. Its zero value is not usable: set
// Pipeline and Access.
type Handler struct {
	Pipeline       *pipeline.Pipeline
	Access         *access.Controller
	MaxRequestBody int64 // bound on a decoded fetch request; 0: DefaultMaxRequestBody
	MaxPushBody    int64 // bound on a decoded push; 0: none
	// LFS serves the Git LFS API, /NAME(.git)/info/lfs/...; nil: not served.
	LFS http.Handler
	Log *slog.Logger
}

// lfsPrefix marks an LFS API path; the transport only routes it.
const lfsPrefix = "/info/lfs/"

const realm = `Basic realm="packwire", charset="UTF-8"`

func (h *Handler) log() *slog.Logger {
	if h.Log == nil {
		return slog.Default()
	}
	return h.Log
}

// Route splits a URL path into the repository part and the smart HTTP
// endpoint it names ("info/refs", "git-upload-pack", "git-receive-pack").
func Route(path string) (repoPath, endpoint string, ok bool) {
	for _, ep := range []string{"/info/refs", "/git-upload-pack", "/git-receive-pack"} {
		if p, found := strings.CutSuffix(path, ep); found && p != "" {
			return p, ep[1:], true
		}
	}
	return "", "", false
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.LFS != nil && strings.Contains(r.URL.Path, lfsPrefix) {
		h.LFS.ServeHTTP(w, r)
		return
	}
	if r.Method == http.MethodPost && r.ProtoMajor == 1 {
		// Every answer to a request whose body was not read to its end
		// closes the connection, and the handler does not wait for the rest:
		// net/http would otherwise read it (up to 256 KiB) before replying,
		// or after, and a client that trickles or never ends its body would
		// hold the connection forever. (HTTP/2 resets the stream instead.)
		body := &trackedBody{ReadCloser: r.Body}
		r.Body = body
		w = &unreadBodyWriter{ResponseWriter: w, body: body}
		defer func() {
			if !body.eof.Load() {
				lingerUnreadBody(w, body)
			}
		}()
	}
	if repoPath, ok := strings.CutSuffix(r.URL.Path, pipeline.BundleSuffix); ok && repoPath != "" {
		h.serveBundle(w, r, repoPath)
		return
	}
	repoPath, endpoint, ok := Route(r.URL.Path)
	if !ok {
		plainError(w, http.StatusNotFound, "not found")
		return
	}
	var serviceName string
	switch endpoint {
	case "info/refs":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			methodNotAllowed(w, "GET")
			return
		}
		serviceName = r.URL.Query().Get("service")
		if serviceName == "" {
			plainError(w, http.StatusForbidden, "packwire serves the smart HTTP protocol only (git 1.6.6 or later)")
			return
		}
	default:
		if r.Method != http.MethodPost {
			methodNotAllowed(w, "POST")
			return
		}
		serviceName = endpoint
	}
	service, ok := gitexec.ParseService(serviceName)
	if !ok || service == gitexec.UploadArchive || serviceName != string(service) {
		plainError(w, http.StatusForbidden, fmt.Sprintf("service not supported: %q", serviceName))
		return
	}

	principal, ok := h.principal(w, r, repoPath)
	if !ok {
		return
	}

	advertise := endpoint == "info/refs"
	req := pipeline.Request{
		Transport:     "http",
		Service:       service,
		RepoPath:      repoPath,
		Protocol:      r.Header.Get("Git-Protocol"),
		Principal:     principal,
		Remote:        r.RemoteAddr,
		StatelessRPC:  true,
		AdvertiseRefs: advertise,
		BaseURL:       baseURL(r),
	}
	var body io.Reader = http.NoBody
	var limited *limitReader
	var gz *lazyGzip
	if !advertise {
		if ct := r.Header.Get("Content-Type"); ct != "application/x-"+string(service)+"-request" {
			plainError(w, http.StatusUnsupportedMediaType, fmt.Sprintf("expected Content-Type application/x-%s-request", service))
			return
		}
		raw := io.Reader(r.Body)
		switch enc := r.Header.Get("Content-Encoding"); enc {
		case "", "identity":
		case "gzip", "x-gzip":
			// Its header is read with the body, under the pipeline's bounds.
			gz = &lazyGzip{r: r.Body}
			defer gz.Close()
			raw = gz
		default:
			plainError(w, http.StatusUnsupportedMediaType, fmt.Sprintf("unsupported Content-Encoding %q", enc))
			return
		}
		max := h.MaxRequestBody
		if max == 0 {
			max = DefaultMaxRequestBody
		}
		if service == gitexec.ReceivePack {
			max = h.MaxPushBody
		}
		limited = &limitReader{r: raw, max: max, remaining: max, unlimited: max <= 0}
		body = limited
	}

	call, err := h.Pipeline.Prepare(r.Context(), req)
	if err != nil {
		writePipelineError(w, err)
		return
	}

	out := &streamWriter{w: w, contentType: "application/x-" + string(service) + resultSuffix(advertise), idle: call.IdleTimeout(),
		closeDelimitedOK: r.ProtoMajor == 1 && r.ProtoMinor >= 1}
	if advertise && !(service == gitexec.UploadPack && protocol.Version(req.Protocol) == 2) {
		// git-http-backend's preamble for protocol v0/v1 advertisements.
		var pre []byte
		pre, _ = pktline.Append(pre, []byte("# service="+string(service)+"\n"))
		pre = append(pre, "0000"...)
		out.Write(pre)
	}
	if r.Method == http.MethodHead {
		call.Abandon()
		out.start()
		return
	}
	res, runErr := call.Run(r.Context(), body, out, nil)
	if gz != nil && gz.malformed.Load() && !out.started {
		plainError(w, http.StatusBadRequest, "malformed gzip request body")
		return
	}
	if limited != nil && limited.exceeded.Load() && !out.started {
		plainError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body too large (limit %d bytes after decoding)", limited.max))
		return
	}
	if !out.started && runErr == nil && res.ExitCode == 0 {
		// Nothing to say and nothing wrong: git's probe before a large push
		// (a body of just "0000", to check credentials before streaming)
		// gets 200 and an empty result, as from git-http-backend.
		out.start()
		return
	}
	var refusal *pipeline.Error
	if !out.started && errors.As(runErr, &refusal) {
		// Admitted only once the body was read, and refused then (too slow,
		// busy, a malformed push).
		writePipelineError(w, runErr)
		return
	}
	if !out.started && errors.Is(runErr, gitexec.ErrIdle) {
		plainError(w, http.StatusRequestTimeout, "request timed out: no data moved for the idle timeout")
		return
	}
	if !out.started {
		// git wrote nothing: a request it rejected. Say so, with git's
		// reason, rather than send an empty 200.
		msg := "git could not process the request"
		if reason := gitReason(res.Stderr); reason != "" {
			msg += ": " + reason
		}
		plainError(w, http.StatusBadRequest, msg)
	}
}

func resultSuffix(advertise bool) string {
	if advertise {
		return "-advertisement"
	}
	return "-result"
}

func methodNotAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	plainError(w, http.StatusMethodNotAllowed, "method not allowed")
}

// plainError sends a one-line text/plain body; git prints it as "remote: ...".
func plainError(w http.ResponseWriter, status int, msg string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	io.WriteString(w, msg+"\n")
}

func writePipelineError(w http.ResponseWriter, err error) {
	var pe *pipeline.Error
	if !errors.As(err, &pe) {
		plainError(w, http.StatusInternalServerError, "internal error")
		return
	}
	status := http.StatusInternalServerError
	switch pe.Code {
	case pipeline.CodeBadRequest:
		status = http.StatusBadRequest
	case pipeline.CodeNotFound:
		status = http.StatusNotFound
	case pipeline.CodeAuthRequired:
		w.Header().Set("WWW-Authenticate", realm)
		status = http.StatusUnauthorized
	case pipeline.CodeForbidden:
		status = http.StatusForbidden
	case pipeline.CodeTimeout:
		status = http.StatusRequestTimeout
	case pipeline.CodeUnavailable:
		retry := max(int(pe.RetryAfter.Round(time.Second)/time.Second), 1)
		w.Header().Set("Retry-After", strconv.Itoa(retry))
		status = http.StatusServiceUnavailable
	}
	plainError(w, status, pe.Message)
}

// streamWriter sends headers on the first write and flushes every write, so
// the client sees git's output as it is produced, never buffered whole.
type streamWriter struct {
	w           http.ResponseWriter
	contentType string
	started     bool
	idle        time.Duration
	// closeDelimitedOK: an HTTP/1.1 response may end with the connection
	// instead of chunks; closeDelimited: this one does.
	closeDelimitedOK, closeDelimited bool
}

func (s *streamWriter) start() {
	if s.started {
		return
	}
	s.started = true
	h := s.w.Header()
	h.Set("Content-Type", s.contentType)
	h.Set("Cache-Control", "no-cache, max-age=0, must-revalidate")
	h.Set("Pragma", "no-cache")
	h.Set("Expires", "Fri, 01 Jan 1980 00:00:00 GMT")
	s.w.WriteHeader(http.StatusOK)
}

func (s *streamWriter) Write(p []byte) (int, error) {
	s.start()
	n, err := s.w.Write(p)
	if err != nil {
		return n, err
	}
	return n, http.NewResponseController(s.w).Flush()
}

// SetWriteDeadline lets the relay cut short a write to a client that
// stopped reading, when the request is killed.
func (s *streamWriter) SetWriteDeadline(t time.Time) error {
	return http.NewResponseController(s.w).SetWriteDeadline(t)
}

// SetReadDeadline bounds the pipeline's reading of the request body.
func (s *streamWriter) SetReadDeadline(t time.Time) error {
	return http.NewResponseController(s.w).SetReadDeadline(t)
}

// serveFileChunk is how much of a file goes out under one write deadline.
const serveFileChunk = 4 << 20

// ServeFile sends size bytes of f, from its current offset, as the whole
// response body. Before anything was written it sets Content-Length, so
// that net/http hands the file to sendfile(2) (no copy through user
// space; plain HTTP only, TLS copies); otherwise it streams as Write does.
func (s *streamWriter) ServeFile(f *os.File, size int64) (int64, error) {
	if s.started {
		return s.copyFile(f, size)
	}
	s.w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	s.start()
	return s.sendFile(f, size)
}

// StreamFile sends the next n bytes of f, from its current offset, as
// part of a response whose length is not known yet (a file still being
// written). Over HTTP/1.1, when nothing was written yet, the response is
// delimited by closing the connection rather than chunked, so that
// net/http hands each range to sendfile(2); a clone makes no request after
// its fetch, so the closed connection costs nothing. Otherwise it streams
// as Write does.
func (s *streamWriter) StreamFile(f *os.File, n int64) (int64, error) {
	if !s.started && s.closeDelimitedOK {
		// net/http then neither chunks nor keeps the connection, and drops the header.
		s.w.Header().Set("Transfer-Encoding", "identity")
		s.closeDelimited = true
		s.start()
	}
	if !s.closeDelimited {
		return s.copyFile(f, n)
	}
	return s.sendFile(f, n)
}

// copyFile writes n bytes of f as Write does (HTTP/2, TLS, a response
// already started), through a pooled buffer: StreamFile runs once per
// wake-up of a followed run, every few milliseconds.
func (s *streamWriter) copyFile(f *os.File, n int64) (int64, error) {
	bufp := gitexec.CopyBuffers.Get().(*[]byte)
	defer gitexec.CopyBuffers.Put(bufp)
	return io.CopyBuffer(struct{ io.Writer }{s}, io.LimitReader(f, n), *bufp)
}

// sendFile copies n bytes of f through net/http's ReadFrom (sendfile on a
// plain TCP connection), a chunk at a time under the idle write deadline.
func (s *streamWriter) sendFile(f *os.File, n int64) (int64, error) {
	rc := http.NewResponseController(s.w)
	var sent int64
	for sent < n {
		if s.idle > 0 {
			rc.SetWriteDeadline(time.Now().Add(s.idle))
		}
		// A LimitReader over the *os.File is what net/http's sendfile path takes.
		c, err := io.Copy(s.w, io.LimitReader(f, min(serveFileChunk, n-sent)))
		sent += c
		if err != nil {
			return sent, err
		}
		if c == 0 {
			return sent, io.ErrUnexpectedEOF
		}
	}
	if s.idle > 0 {
		rc.SetWriteDeadline(time.Time{})
	}
	return sent, nil
}

// limitReader fails once more than remaining bytes are read; it records
// that, so a gzip bomb becomes a 413 and not a broken git stream.
type limitReader struct {
	r         io.Reader
	max       int64
	remaining int64
	read      int64
	unlimited bool
	// Read by the handler after Run, while a relay goroutine may still be
	// reading the body.
	exceeded atomic.Bool
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.unlimited {
		n, err := l.r.Read(p)
		l.read += int64(n)
		return n, err
	}
	if l.remaining <= 0 {
		// One byte more tells "exactly at the limit" from "over it".
		var one [1]byte
		if n, _ := l.r.Read(one[:]); n > 0 {
			l.exceeded.Store(true)
			return 0, errors.New("request body too large")
		}
		return 0, io.EOF
	}
	if int64(len(p)) > l.remaining {
		p = p[:l.remaining]
	}
	n, err := l.r.Read(p)
	l.remaining -= int64(n)
	l.read += int64(n)
	return n, err
}

// Lingering on an unread body after the answer: a client still sending its
// body when the connection closes gets a reset that may destroy the answer
// before it reads it. Bounded, so that a client that trickles or never
// ends costs at most this much.
const (
	lingerBytes = 1 << 20
	lingerTime  = time.Second
)

// lingerUnreadBody sends the answer, then reads and drops what the client
// still sends of its body, within the bounds, so that it can read the
// answer before the connection closes.
func lingerUnreadBody(w http.ResponseWriter, body io.Reader) {
	rc := http.NewResponseController(w)
	rc.Flush()
	rc.SetReadDeadline(time.Now().Add(lingerTime))
	io.CopyN(io.Discard, body, lingerBytes)
	rc.SetReadDeadline(time.Now())
}

// gitReason is the last line git wrote to stderr ("fatal: Invalid deepen:
// deepen -1"), without its "fatal: ", made printable and short.
func gitReason(stderr string) string {
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	last := strings.TrimPrefix(strings.TrimSpace(lines[len(lines)-1]), "fatal: ")
	last = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, last)
	if len(last) > 300 {
		last = last[:300]
	}
	return last
}

// lazyGzip decodes a gzip body, reading its header only on the first Read
// (so a client that trickles even that is bounded where the body is).
type lazyGzip struct {
	r         io.Reader
	z         *gzip.Reader
	malformed atomic.Bool
}

func (l *lazyGzip) Read(p []byte) (int, error) {
	if l.z == nil {
		z, err := gzip.NewReader(l.r)
		if err != nil {
			l.check(err)
			return 0, err
		}
		l.z = z
	}
	n, err := l.z.Read(p)
	l.check(err)
	return n, err
}

// check records an error of the encoding itself (not of the stream under it).
func (l *lazyGzip) check(err error) {
	var corrupt flate.CorruptInputError
	if errors.Is(err, gzip.ErrHeader) || errors.Is(err, gzip.ErrChecksum) || errors.As(err, &corrupt) {
		l.malformed.Store(true)
	}
}

func (l *lazyGzip) Close() error {
	if l.z != nil {
		return l.z.Close()
	}
	return nil
}

// trackedBody knows whether a request body was read to its end.
type trackedBody struct {
	io.ReadCloser
	eof atomic.Bool
}

func (b *trackedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.eof.Store(true)
	}
	return n, err
}

// unreadBodyWriter adds "Connection: close" to a response sent before its
// request's body was read to the end (see ServeHTTP).
type unreadBodyWriter struct {
	http.ResponseWriter
	body *trackedBody
}

func (u *unreadBodyWriter) WriteHeader(status int) {
	if !u.body.eof.Load() {
		u.Header().Set("Connection", "close")
	}
	u.ResponseWriter.WriteHeader(status)
}

func (u *unreadBodyWriter) Write(p []byte) (int, error) {
	if !u.body.eof.Load() && u.Header().Get("Connection") == "" {
		u.Header().Set("Connection", "close") // no effect once the header is out
	}
	return u.ResponseWriter.Write(p)
}

// ReadFrom keeps net/http's sendfile path for files the pipeline serves.
func (u *unreadBodyWriter) ReadFrom(r io.Reader) (int64, error) {
	return u.ResponseWriter.(io.ReaderFrom).ReadFrom(r)
}

// Unwrap lets http.ResponseController reach net/http's writer.
func (u *unreadBodyWriter) Unwrap() http.ResponseWriter { return u.ResponseWriter }
