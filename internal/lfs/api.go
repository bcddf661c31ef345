package lfs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"packwire/internal/access"
	"packwire/internal/governor"
	"packwire/internal/transport/accept"
	"packwire/internal/transport/forwarded"
)

// ContentType is the media type of every LFS API request and answer.
const ContentType = "application/vnd.git-lfs+json"

// Prefix is what, in a URL path, separates the repository from the LFS API.
const Prefix = "/info/lfs/"

// maxJSONBody bounds a batch or locks request: 100 objects of git-lfs's
// batches take ~15 KiB.
const maxJSONBody = 10 << 20

// maxBatchObjects bounds the objects of one batch request (git-lfs sends 100).
const maxBatchObjects = 1000

// actionTTL is how long the hrefs of a batch answer are good for (they
// carry the request's own credentials, which say for themselves).
const actionTTL = time.Hour

const realm = `Basic realm="packwire", charset="UTF-8"`

// Route splits an LFS URL path into the repository path and the API path
// after Prefix ("objects/batch", "locks/12/unlock"); ok is false for a path
// that is not LFS's.
func Route(path string) (repoPath, rest string, ok bool) {
	i := strings.LastIndex(path, Prefix)
	if i <= 0 {
		return "", "", false
	}
	return path[:i], path[i+len(Prefix):], true
}

// ServeHTTP serves /NAME(.git)/info/lfs/...
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	repoPath, rest, ok := Route(r.URL.Path)
	if !ok {
		writeError(w, &apiError{http.StatusNotFound, "not found"})
		return
	}
	p, aerr := s.principal(r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	switch {
	case rest == "objects/batch" && r.Method == http.MethodPost:
		s.batch(w, r, p, repoPath)
	case rest == "objects/verify" && r.Method == http.MethodPost:
		s.verify(w, r, p, repoPath)
	case strings.HasPrefix(rest, "objects/") && ValidOID(rest[len("objects/"):]):
		oid := rest[len("objects/"):]
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			s.download(w, r, p, repoPath, oid)
		case http.MethodPut:
			s.upload(w, r, p, repoPath, oid)
		default:
			w.Header().Set("Allow", "GET, HEAD, PUT")
			writeError(w, &apiError{http.StatusMethodNotAllowed, "method not allowed"})
		}
	case strings.HasPrefix(rest, "objects/"):
		writeError(w, &apiError{http.StatusUnprocessableEntity, "invalid object id: 64 lowercase hex digits expected"})
	case rest == "locks" || strings.HasPrefix(rest, "locks/"):
		s.locks(w, r, p, repoPath, strings.TrimPrefix(strings.TrimPrefix(rest, "locks"), "/"))
	default:
		writeError(w, &apiError{http.StatusNotFound, "not found"})
	}
}

// principal turns HTTP Basic credentials (a packwire token) into a
// principal, as git's HTTP transport does.
func (s *Service) principal(r *http.Request) (access.Principal, *apiError) {
	user, token, ok := r.BasicAuth()
	if !ok {
		return access.Anonymous, nil
	}
	p, err := s.Access.PrincipalForToken(r.Context(), user, token)
	if err == nil {
		return p, nil
	}
	if !errors.Is(err, access.ErrBadCredentials) {
		s.log().Warn("checking credentials", "transport", "http", "remote", r.RemoteAddr, "error", err.Error())
		return access.Principal{}, &apiError{http.StatusServiceUnavailable, "temporarily unavailable: the store did not answer, retry shortly"}
	}
	return access.Principal{}, &apiError{http.StatusUnauthorized, "invalid credentials: use a packwire token as the password"}
}

// writeError answers in LFS's error format; a 401 carries LFS-Authenticate
// (and WWW-Authenticate) so that git-lfs asks for credentials.
func writeError(w http.ResponseWriter, e *apiError) {
	if e.Status == http.StatusUnauthorized {
		w.Header().Set("LFS-Authenticate", realm)
		w.Header().Set("WWW-Authenticate", realm)
	}
	if e.Status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "5")
	}
	writeJSON(w, e.Status, struct {
		Message string `json:"message"`
	}{e.Message})
}

// writeJSON answers v with a Content-Length: a batch answer over net/http's
// 4 KiB buffer would otherwise go chunked, and git-lfs (Go's client) stops
// decoding before the last chunk and so closes the connection instead of
// reusing it for the downloads (TestLFSPullReusesConnection).
func writeJSON(w http.ResponseWriter, status int, v any) {
	var body bytes.Buffer
	json.NewEncoder(&body).Encode(v)
	w.Header().Set("Content-Type", ContentType)
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("Content-Length", strconv.Itoa(body.Len()))
	w.WriteHeader(status)
	w.Write(body.Bytes())
}

// readJSON decodes a bounded request body into v.
func readJSON(r *http.Request, v any) *apiError {
	dec := json.NewDecoder(io.LimitReader(r.Body, maxJSONBody))
	if err := dec.Decode(v); err != nil {
		return &apiError{http.StatusUnprocessableEntity, "malformed request: " + err.Error()}
	}
	return nil
}

type batchObject struct {
	OID           string             `json:"oid"`
	Size          int64              `json:"size"`
	Authenticated bool               `json:"authenticated,omitempty"`
	Actions       map[string]*action `json:"actions,omitempty"`
	Error         *objectError       `json:"error,omitempty"`
}

type action struct {
	Href      string            `json:"href"`
	Header    map[string]string `json:"header,omitempty"`
	ExpiresIn int               `json:"expires_in,omitempty"`
}

type objectError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

type batchRequest struct {
	Operation string        `json:"operation"`
	Transfers []string      `json:"transfers"`
	Objects   []batchObject `json:"objects"`
	HashAlgo  string        `json:"hash_algo"`
}

// baseURL is the LFS API's URL for this request's repository, as the
// client reached it.
func baseURL(r *http.Request, repoPath string) string {
	return forwarded.Scheme(r) + "://" + r.Host + repoPath + strings.TrimSuffix(Prefix, "/")
}

func (s *Service) batch(w http.ResponseWriter, r *http.Request, p access.Principal, repoPath string) {
	var req batchRequest
	if e := readJSON(r, &req); e != nil {
		writeError(w, e)
		return
	}
	n := needRead
	switch req.Operation {
	case "download":
	case "upload":
		n = needWrite
	default:
		writeError(w, &apiError{http.StatusUnprocessableEntity, fmt.Sprintf("unknown operation %q (download or upload)", req.Operation)})
		return
	}
	if req.HashAlgo != "" && req.HashAlgo != "sha256" {
		writeError(w, &apiError{http.StatusConflict, fmt.Sprintf("unsupported hash algorithm %q (sha256)", req.HashAlgo)})
		return
	}
	if len(req.Transfers) > 0 && !contains(req.Transfers, "basic") {
		writeError(w, &apiError{http.StatusUnprocessableEntity, "no supported transfer adapter (basic)"})
		return
	}
	if len(req.Objects) > maxBatchObjects {
		writeError(w, &apiError{http.StatusRequestEntityTooLarge, fmt.Sprintf("too many objects in one batch (max %d)", maxBatchObjects)})
		return
	}
	rp, aerr := s.authorize(r.Context(), p, repoPath, n, true)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	base := baseURL(r, repoPath)
	header := map[string]string{}
	if a := r.Header.Get("Authorization"); a != "" {
		header["Authorization"] = a
	}
	out := make([]batchObject, 0, len(req.Objects))
	var newBytes int64
	for _, o := range req.Objects {
		res := batchObject{OID: o.OID, Size: o.Size}
		out = append(out, res)
		ob := &out[len(out)-1]
		if e := s.checkObject(o.OID, o.Size); e != nil {
			ob.Error = e
			continue
		}
		size, held, err := s.Index.Size(r.Context(), rp.Name, o.OID)
		if err != nil {
			writeError(w, &apiError{http.StatusServiceUnavailable, "temporarily unavailable: the LFS index did not answer"})
			return
		}
		_, stored := s.Objects.Stat(o.OID)
		href := base + "/objects/" + o.OID
		if req.Operation == "download" {
			if !held || !stored {
				ob.Error = &objectError{http.StatusNotFound, "Object does not exist"}
				continue
			}
			if size != o.Size {
				ob.Error = &objectError{http.StatusUnprocessableEntity, fmt.Sprintf("Object %s is %d bytes, not %d", o.OID, size, o.Size)}
				continue
			}
			ob.Authenticated = true
			ob.Actions = map[string]*action{"download": {Href: href, Header: header, ExpiresIn: int(actionTTL / time.Second)}}
			// A store that serves downloads itself gets a pre-signed URL
			// (no header: the signature is the credential), handed out
			// only here, once the index let this client read.
			if u, err := s.Objects.DownloadURL(r.Context(), o.OID, actionTTL); err != nil {
				s.log().Warn("lfs: pre-signing a download", "oid", o.OID, "error", err.Error())
			} else if u != "" {
				ob.Actions["download"] = &action{Href: u, ExpiresIn: int(actionTTL / time.Second)}
			}
			continue
		}
		if held && stored && size == o.Size {
			continue // nothing to send: no actions
		}
		newBytes += o.Size
		ob.Authenticated = true
		ob.Actions = map[string]*action{
			"upload": {Href: href, Header: header, ExpiresIn: int(actionTTL / time.Second)},
			"verify": {Href: base + "/objects/verify", Header: header, ExpiresIn: int(actionTTL / time.Second)},
		}
	}
	if newBytes > 0 {
		room, err := s.quotaRoom(r.Context(), rp)
		if err != nil {
			writeError(w, &apiError{http.StatusInternalServerError, "internal error reading the repository's quota"})
			return
		}
		if room >= 0 && newBytes > room {
			writeError(w, &apiError{http.StatusInsufficientStorage, fmt.Sprintf("repository '%s' is over its quota: %d bytes of LFS objects to upload, %d bytes left", rp.Name, newBytes, room)})
			return
		}
	}
	writeJSON(w, http.StatusOK, struct {
		Transfer string        `json:"transfer"`
		Objects  []batchObject `json:"objects"`
		HashAlgo string        `json:"hash_algo"`
	}{"basic", out, "sha256"})
}

// checkObject validates an oid and size from a request.
func (s *Service) checkObject(oid string, size int64) *objectError {
	if !ValidOID(oid) {
		return &objectError{http.StatusUnprocessableEntity, "invalid object id: 64 lowercase hex digits expected"}
	}
	if size < 0 {
		return &objectError{http.StatusUnprocessableEntity, "invalid object size"}
	}
	if s.MaxObjectBytes > 0 && size > s.MaxObjectBytes {
		return &objectError{http.StatusRequestEntityTooLarge, fmt.Sprintf("object of %d bytes is over the server's limit of %d bytes", size, s.MaxObjectBytes)}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func (s *Service) download(w http.ResponseWriter, r *http.Request, p access.Principal, repoPath, oid string) {
	start := time.Now()
	rp, aerr := s.authorize(r.Context(), p, repoPath, needRead, true)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	_, held, err := s.Index.Size(r.Context(), rp.Name, oid)
	if err != nil {
		writeError(w, &apiError{http.StatusServiceUnavailable, "temporarily unavailable: the LFS index did not answer"})
		return
	}
	if !held {
		writeError(w, &apiError{http.StatusNotFound, "Object does not exist"})
		return
	}
	f, fi, err := s.Objects.Open(oid)
	if err != nil {
		writeError(w, &apiError{http.StatusNotFound, "Object does not exist"})
		return
	}
	defer f.Close()
	cw := &countingWriter{ResponseWriter: w}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("ETag", `"`+oid+`"`)
	// ServeContent: Range and If-None-Match; the *os.File reaches
	// sendfile(2) through the ResponseWriter's ReadFrom, in as large a
	// socket buffer as the system allows (fewer EAGAINs and wake-ups).
	if r.Method == http.MethodGet {
		accept.GrowSendBuffer(r.Context())
	}
	http.ServeContent(cw, r, "", fi.ModTime(), f)
	result, errText := governor.ResultOK, ""
	if r.Context().Err() != nil {
		result, errText = governor.ResultClientGone, "client went away"
	}
	if r.Method == http.MethodGet {
		s.record("lfs-download", "http", rp, p, r.RemoteAddr, start, 0, cw.n, result, errText)
	}
}

// countingWriter counts the body bytes sent and keeps ReadFrom (sendfile).
type countingWriter struct {
	http.ResponseWriter
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n += int64(n)
	return n, err
}

func (c *countingWriter) ReadFrom(r io.Reader) (int64, error) {
	n, err := c.ResponseWriter.(io.ReaderFrom).ReadFrom(r)
	c.n += n
	return n, err
}

func (c *countingWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

func (s *Service) upload(w http.ResponseWriter, r *http.Request, p access.Principal, repoPath, oid string) {
	start := time.Now()
	rp, aerr := s.authorize(r.Context(), p, repoPath, needWrite, true)
	if aerr != nil {
		closeUnread(w)
		writeError(w, aerr)
		return
	}
	size := r.ContentLength
	if size < 0 {
		closeUnread(w)
		writeError(w, &apiError{http.StatusLengthRequired, "Content-Length required"})
		return
	}
	if e := s.checkObject(oid, size); e != nil {
		closeUnread(w)
		writeError(w, &apiError{e.Code, e.Message})
		return
	}
	if room, err := s.quotaRoom(r.Context(), rp); err != nil || room >= 0 && size > room {
		closeUnread(w)
		if err != nil {
			writeError(w, &apiError{http.StatusInternalServerError, "internal error reading the repository's quota"})
		} else {
			writeError(w, &apiError{http.StatusInsufficientStorage, fmt.Sprintf("repository '%s' is over its quota: %d bytes left", rp.Name, room)})
		}
		return
	}
	n, err := s.Objects.Put(oid, size, r.Body)
	if err == nil {
		err = s.Index.Add(context.WithoutCancel(r.Context()), rp.Name, oid, size)
	}
	if err != nil {
		status, result := http.StatusInternalServerError, governor.ResultGitError
		switch {
		case errors.Is(err, ErrSizeMismatch), errors.Is(err, ErrHashMismatch):
			status, result = http.StatusUnprocessableEntity, governor.ResultRefused
		case r.Context().Err() != nil || errors.Is(err, io.ErrUnexpectedEOF):
			status, result = http.StatusBadRequest, governor.ResultClientGone
		}
		s.record("lfs-upload", "http", rp, p, r.RemoteAddr, start, n, 0, result, err.Error())
		closeUnread(w)
		writeError(w, &apiError{status, err.Error()})
		return
	}
	s.record("lfs-upload", "http", rp, p, r.RemoteAddr, start, n, 0, governor.ResultOK, "")
	w.WriteHeader(http.StatusOK)
}

// closeUnread: an answer before the body was read ends the connection,
// rather than net/http reading the rest of a large upload.
func closeUnread(w http.ResponseWriter) { w.Header().Set("Connection", "close") }

func (s *Service) verify(w http.ResponseWriter, r *http.Request, p access.Principal, repoPath string) {
	var o batchObject
	if e := readJSON(r, &o); e != nil {
		writeError(w, e)
		return
	}
	rp, aerr := s.authorize(r.Context(), p, repoPath, needWrite, true)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	if !ValidOID(o.OID) {
		writeError(w, &apiError{http.StatusUnprocessableEntity, "invalid object id: 64 lowercase hex digits expected"})
		return
	}
	size, held, err := s.Index.Size(r.Context(), rp.Name, o.OID)
	if err != nil {
		writeError(w, &apiError{http.StatusServiceUnavailable, "temporarily unavailable: the LFS index did not answer"})
		return
	}
	if _, stored := s.Objects.Stat(o.OID); !held || !stored {
		writeError(w, &apiError{http.StatusNotFound, "Object does not exist"})
		return
	}
	if size != o.Size {
		writeError(w, &apiError{http.StatusUnprocessableEntity, fmt.Sprintf("Object %s is %d bytes, not %d", o.OID, size, o.Size)})
		return
	}
	writeJSON(w, http.StatusOK, struct{}{})
}
