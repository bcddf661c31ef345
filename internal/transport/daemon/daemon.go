// Package daemon serves the git:// protocol (git-daemon's wire format): one
// pkt-line request "git-upload-pack /path\0host=h\0\0version=2\0", then the
// service's own stream. It only translates framing into a pipeline.Request.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"packwire/internal/access"
	"packwire/internal/gitexec"
	"packwire/internal/pipeline"
	"packwire/internal/pktline"
	"packwire/internal/transport/accept"
)

// Server accepts git:// connections. Zero InitTimeout and MaxConnections
// mean no limit.
type Server struct {
	Pipeline       *pipeline.Pipeline
	InitTimeout    time.Duration // time allowed for the request line (at start; see SetInitTimeout)
	MaxConnections int
	Startups       *accept.Startups // per address, connections before their request line; nil: no bound
	// Penalties refuse at accept the addresses that keep sending malformed
	// requests or overrunning Startups; nil: none.
	Penalties *accept.Penalties
	Log       *slog.Logger

	refusals    accept.RefusalLog
	initTimeout atomic.Pointer[time.Duration] // SetInitTimeout's; nil: InitTimeout
	conns       atomic.Int64
	mu          sync.Mutex
	listener    net.Listener
	closed      bool
	// stopping: StopAccepting ended the accept loop (loopDone closed) but
	// the connections accepted go on.
	stopping bool
	loopDone chan struct{}
	waiting  map[net.Conn]bool // connections still sending their request line
	wg       sync.WaitGroup
}

// SetInitTimeout changes InitTimeout for the connections accepted from
// now on (a configuration reload); those reading their request keep theirs.
func (s *Server) SetInitTimeout(d time.Duration) { s.initTimeout.Store(&d) }

func (s *Server) initTimeoutNow() time.Duration {
	if d := s.initTimeout.Load(); d != nil {
		return *d
	}
	return s.InitTimeout
}

// ErrServerClosed is returned by Serve after Close.
var ErrServerClosed = errors.New("daemon: server closed")

// Request is a parsed git:// request line.
type Request struct {
	Service  string // "git-upload-pack" as sent
	Path     string
	Host     string
	Protocol string // extra parameters joined with ':' (GIT_PROTOCOL)
}

// ParseRequest parses the payload of the first pkt-line of a git://
// connection, following gitprotocol-pack's git-proto-request.
func ParseRequest(line []byte) (Request, error) {
	s := strings.TrimSuffix(string(line), "\n")
	cmdPath, rest, ok := strings.Cut(s, "\x00")
	if !ok {
		return Request{}, errors.New("malformed request: no NUL after path")
	}
	service, path, ok := strings.Cut(cmdPath, " ")
	if !ok || service == "" || path == "" {
		return Request{}, errors.New("malformed request: want 'git-upload-pack /path'")
	}
	req := Request{Service: service, Path: path}
	// rest: [host=HOST\0] [\0 extra\0 ...]
	host, extras, _ := strings.Cut(rest, "\x00")
	if host != "" {
		h, ok := strings.CutPrefix(host, "host=")
		if !ok {
			return Request{}, errors.New("malformed request: bad host parameter")
		}
		req.Host = h
	}
	var params []string
	for _, p := range strings.Split(extras, "\x00") {
		if p != "" {
			params = append(params, p)
		}
	}
	req.Protocol = strings.Join(params, ":")
	return req, nil
}

// Serve accepts connections on l until Close.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrServerClosed
	}
	s.listener = l
	s.loopDone = make(chan struct{})
	defer close(s.loopDone)
	s.mu.Unlock()
	s.refusals.Log = s.log().With("transport", "git")
	defer s.refusals.Stop()
	err := accept.Loop(l, s.log().With("transport", "git"), s.isStopped, func(conn net.Conn) {
		// Before anything is allocated for it: a penalized address's
		// flood costs an accept and a close.
		if s.Penalties.Refused(conn.RemoteAddr()) {
			s.Penalties.Reject(conn)
			return
		}
		conn = accept.QuickAck(conn)
		// Add under the lock Close takes: Wait after Close never races it.
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed {
			conn.Close()
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.handle(conn)
		}()
	})
	if err == nil {
		return ErrServerClosed
	}
	return err
}

func (s *Server) isStopped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed || s.stopping
}

// StopAccepting closes the listener (in this process: a next process
// that inherited the socket accepts on it) and returns once the accept
// loop has ended. Unlike Close, connections still sending their request
// line are left to send it and be served; Wait waits for them all.
func (s *Server) StopAccepting() {
	s.mu.Lock()
	s.stopping = true
	done := s.loopDone
	if s.listener != nil {
		s.listener.Close()
	}
	s.mu.Unlock()
	if done != nil {
		<-done
	}
}

// Close stops accepting and drops connections that have not sent their
// request yet; running requests are drained by the pipeline.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for c := range s.waiting {
		c.Close()
	}
	if s.listener != nil {
		return s.listener.Close()
	}
	return nil
}

// track records whether conn is still waiting for its request line; it
// reports false if the server is closing and the connection should end.
func (s *Server) track(conn net.Conn, waiting bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waiting == nil {
		s.waiting = make(map[net.Conn]bool)
	}
	if waiting {
		s.waiting[conn] = true
	} else {
		delete(s.waiting, conn)
	}
	return !s.closed
}

// Wait blocks until every connection handler has returned.
func (s *Server) Wait() { s.wg.Wait() }

func (s *Server) log() *slog.Logger {
	if s.Log == nil {
		return slog.Default()
	}
	return s.Log
}

func (s *Server) handle(conn net.Conn) {
	remote := conn.RemoteAddr().String()
	started, ok := s.Startups.Begin(conn.RemoteAddr())
	if !ok {
		s.refusals.Note(accept.StartupsReason(s.Startups.Max()), remote)
		s.Penalties.Offend(conn.RemoteAddr(), accept.CostBusy, "over --max-startups-per-address")
		s.Startups.Refuse(conn, func(c net.Conn) { readThenRefuse(c, accept.StartupsMessage(s.Startups.Max())) })
		return
	}
	defer started()
	defer conn.Close()
	n := s.conns.Add(1)
	defer s.conns.Add(-1)
	if s.MaxConnections > 0 && n > int64(s.MaxConnections) {
		s.refusals.Note(fmt.Sprintf("too many connections (max %d)", s.MaxConnections), remote)
		readThenRefuse(conn, accept.BusyMessage(s.MaxConnections))
		return
	}
	if !s.track(conn, true) {
		return
	}
	if d := s.initTimeoutNow(); d > 0 {
		conn.SetReadDeadline(time.Now().Add(d))
	}
	kind, line, err := pktline.NewReader(conn).Read()
	started()
	if !s.track(conn, false) {
		return
	}
	if err != nil || kind != pktline.Data {
		if err == nil {
			err = errors.New("expected a request line, got a special packet")
		}
		s.refusals.NoteError("bad request line", remote, errors.New(errorText(err)))
		s.offend(conn, err)
		refuse(conn, "malformed request: "+errorText(err))
		return
	}
	conn.SetReadDeadline(time.Time{})
	dreq, err := ParseRequest(line)
	if err != nil {
		s.refusals.NoteError("bad request line", remote, err)
		s.Penalties.Offend(conn.RemoteAddr(), accept.CostProtocol, "bad request line")
		refuse(conn, err.Error())
		return
	}
	service, ok := gitexec.ParseService(dreq.Service)
	if !ok || dreq.Service != string(service) {
		refuse(conn, fmt.Sprintf("service not supported: %q", dreq.Service))
		return
	}
	if service == gitexec.ReceivePack {
		refuse(conn, "push over git:// is not supported: git:// has no authentication; push over ssh:// or http(s):// instead")
		return
	}
	req := pipeline.Request{
		Transport: "git",
		Service:   service,
		RepoPath:  dreq.Path,
		Protocol:  dreq.Protocol,
		Principal: access.Anonymous,
		Remote:    remote,
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	call, err := s.Pipeline.Prepare(ctx, req)
	if err != nil {
		refuse(conn, err.Error())
		return
	}
	// git's stderr is not part of the git:// protocol: it goes to the log only.
	out := fileConn{Conn: conn, idle: call.IdleTimeout()}
	if _, err := call.Run(ctx, conn, out, nil); pipeline.IsProtocolError(err) {
		s.Penalties.Offend(conn.RemoteAddr(), accept.CostProtocol, "malformed packet")
	}
}

// offend charges the address of a connection whose request line never
// came whole: a timeout as grace exceeded, anything else but a close
// before the first byte as malformed.
func (s *Server) offend(conn net.Conn, err error) {
	if errors.Is(err, io.EOF) {
		return // closed before a byte: a port check, not an attack
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		s.Penalties.Offend(conn.RemoteAddr(), accept.CostTimeout, "no request line within --init-timeout")
		return
	}
	s.Penalties.Offend(conn.RemoteAddr(), accept.CostProtocol, "malformed request line")
}

// sendFileChunk is how much of a file goes out under one write deadline.
const sendFileChunk = 4 << 20

// fileConn is the client stream as the pipeline writes to it. It lets the
// fetch cache send an answer's file with sendfile(2) (io.Copy from an
// *os.File into the TCP connection) rather than read it into a buffer and
// write that: a git:// replay's bytes then never pass through packwire.
// A git:// stream has no framing of its own, so a file's bytes go out as
// they are at any point of a session.
type fileConn struct {
	net.Conn
	idle time.Duration // per-chunk write deadline (the idle timeout); 0: none
}

// ServeFile sends size bytes of f from its current offset.
func (c fileConn) ServeFile(f *os.File, size int64) (int64, error) { return c.sendFile(f, size) }

// StreamFile sends the next n bytes of f from its current offset.
func (c fileConn) StreamFile(f *os.File, n int64) (int64, error) { return c.sendFile(f, n) }

func (c fileConn) sendFile(f *os.File, n int64) (int64, error) {
	var sent int64
	for sent < n {
		if c.idle > 0 {
			c.SetWriteDeadline(time.Now().Add(c.idle))
		}
		// A LimitReader over the *os.File is what net.TCPConn's ReadFrom
		// hands to sendfile; other connections copy as io.Copy does.
		k, err := io.Copy(c.Conn, io.LimitReader(f, min(sendFileChunk, n-sent)))
		sent += k
		if err != nil {
			return sent, err
		}
		if k == 0 {
			return sent, io.ErrUnexpectedEOF
		}
	}
	if c.idle > 0 {
		c.SetWriteDeadline(time.Time{})
	}
	return sent, nil
}

// readThenRefuse reads the request line for up to a second, then refuses:
// a client still writing it when the connection closes dies of EPIPE
// instead of showing the message.
func readThenRefuse(conn net.Conn, msg string) {
	conn.SetReadDeadline(time.Now().Add(time.Second))
	pktline.NewReader(conn).Read()
	refuse(conn, msg)
}

// refuse sends an ERR packet and half-closes, then waits briefly for the
// client to close first: closing with unread input would send a reset that
// can destroy the message before git reads it.
func refuse(conn net.Conn, msg string) {
	pktline.WriteError(conn, msg)
	if hc, ok := conn.(interface{ CloseWrite() error }); ok {
		hc.CloseWrite()
	}
	conn.SetReadDeadline(time.Now().Add(time.Second))
	io.Copy(io.Discard, io.LimitReader(conn, 1<<20))
}

func errorText(err error) string {
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed before the request line ended"
	case errors.Is(err, pktline.ErrBadLength), errors.Is(err, pktline.ErrTooLong):
		return err.Error()
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timed out waiting for the request line"
	}
	return err.Error()
}
