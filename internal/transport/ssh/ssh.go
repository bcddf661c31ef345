// Package ssh serves git over SSH (golang.org/x/crypto/ssh). It turns the
// client's key into a principal, the exec request into a pipeline.Request,
// and relays the session channel to git; the pipeline decides everything
// else. Nothing is ever run through a shell.
package ssh

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"packwire/internal/access"
	"packwire/internal/pipeline"
	"packwire/internal/transport/accept"
)

// Server accepts SSH connections and serves git exec requests on them.
type Server struct {
	Pipeline *pipeline.Pipeline
	Access   *access.Controller
	HostKeys []gossh.Signer // one per key type; see offeredHostKey for RSA
	Ciphers  []string       // preference order offered; nil: DefaultCiphers
	// The timeouts at start (SetTimeouts changes them for later connections):
	InitTimeout    time.Duration     // handshake + first exec must finish within this
	KeepAlive      time.Duration     // interval of keepalive@openssh.com probes; 0: off
	IdleTimeout    time.Duration     // close a connection once no command ran for this long after its last; 0: never
	MaxConnections int               // 0: no limit
	Startups       *accept.Startups  // per address, connections before their first command; nil: no bound
	Penalties      *accept.Penalties // refuse at accept the addresses that keep failing handshakes or sending malformed packets; nil: none
	MaxSessions    int               // session channels open at once per connection; 0: no limit
	KeyRecheck     time.Duration     // how often open connections' keys are checked again once the store changed; 0: keyRecheckInterval
	MaxUnacked     int               // bytes of a command's output sent and not yet acknowledged by the client's window; 0: DefaultMaxUnacked, <0: the client's whole window
	LFS            LFSCommands       // git-lfs-authenticate and git-lfs-transfer; nil: refused as any unknown command
	Log            *slog.Logger

	refusals accept.RefusalLog
	timeouts atomic.Pointer[Timeouts] // SetTimeouts'; nil: the fields'
	mu       sync.Mutex
	listener net.Listener
	closed   bool
	conns    map[*conn]struct{} // connections past the handshake
	wg       sync.WaitGroup     // connection handlers
	// handling counts connection handlers alone (wg has watchKeys too),
	// for StopAccepting's callers to wait on; stopping: the accept loop
	// was ended by StopAccepting (loopDone closed).
	handling  sync.WaitGroup
	stopping  bool
	loopDone  chan struct{}
	open      atomic.Int64  // connections now open, counted against MaxConnections
	accepted  atomic.Int64  // connections accepted since start
	pacingOff sync.Once     // logs once that windowOf failed
	stopKeys  chan struct{} // closed by Close: ends watchKeys
}

// LFSCommands runs Git LFS's SSH commands (git-lfs-authenticate NAME OP)
// for a principal; the transport only routes them.
type LFSCommands interface {
	IsSSHCommand(command string) bool
	ServeSSH(ctx context.Context, p access.Principal, remote, command string, stdin io.Reader, stdout, stderr io.Writer) (status uint32)
}

// DefaultCiphers are AES only. The client's preference decides which
// cipher both offer is used (RFC 4253 7.1), and OpenSSH's client puts
// chacha20-poly1305 first: x/crypto/ssh's chacha20 has no amd64 assembly,
// and measured 263 MB/s against 1.5 GB/s for AES-CTR with HMAC-SHA2-256
// (what OpenSSH takes next: aes128-ctr, hmac-sha2-256-etm) and 5.6 GB/s for
// AES-GCM, so a 3.4 MiB clone spent ~13 ms of server CPU encrypting. AES-CTR
// stays for clients without AES-GCM (libssh2 before 1.11, paramiko).
var DefaultCiphers = []string{"aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr", "aes192-ctr", "aes256-ctr"}

// ErrServerClosed is returned by Serve after Close.
var ErrServerClosed = errors.New("ssh: server closed")

// ServerVersion is the identification string sent before key exchange.
const ServerVersion = "SSH-2.0-packwire"

// Extensions of gossh.Permissions that carry the identity from
// authentication to the session. Auth callbacks keep no other state: the
// library may call them for keys that are then not used.
const (
	extUser = "packwire-user"   // empty for anonymous
	extVia  = "packwire-via"    // access.Principal.Via
	extKey  = "packwire-key-fp" // SHA256 fingerprint, for logs; empty without a key
	// extUnavailable: the key's owner could not be looked up (the store
	// did not answer); every command is refused as unavailable.
	extUnavailable = "packwire-unavailable"
)

// keepAliveMisses is how many unanswered keepalive probes close a connection
// with no command running.
const keepAliveMisses = 3

// tcpKeepAlive lets the kernel find a peer that vanished without a FIN while
// a command runs, when unanswered SSH keepalives do not count: after 30 s of
// silence, 4 probes 15 s apart, so about 90 s.
var tcpKeepAlive = net.KeepAliveConfig{Enable: true, Idle: 30 * time.Second, Interval: 15 * time.Second, Count: 4}

// Serve accepts connections on l until Close.
func (s *Server) Serve(l net.Listener) error {
	if len(s.HostKeys) == 0 {
		return errors.New("ssh: no host key")
	}
	config := s.serverConfig()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrServerClosed
	}
	s.listener = l
	if s.stopKeys == nil {
		s.stopKeys = make(chan struct{})
		if s.Access != nil {
			// The channel, not the field: Close sets the field to nil.
			stop := s.stopKeys
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				s.watchKeys(stop)
			}()
		}
	}
	s.loopDone = make(chan struct{})
	defer close(s.loopDone)
	s.mu.Unlock()
	s.refusals.Log = s.log().With("transport", "ssh")
	defer s.refusals.Stop()
	err := accept.Loop(l, s.log().With("transport", "ssh"), s.isClosed, func(nc net.Conn) {
		// Before anything is allocated for it, the key exchange above all.
		if s.Penalties.Refused(nc.RemoteAddr()) {
			s.Penalties.Reject(nc)
			return
		}
		rtt, known := handshakeRTT(nc)
		near := known && rtt <= preferMaxRTT
		if tc, ok := nc.(*net.TCPConn); ok {
			tc.SetKeepAliveConfig(tcpKeepAlive)
		}
		nc = &readBufferedConn{Conn: accept.QuickAck(nc)}
		// Add under the lock that Close takes, so that Wait after Close
		// never races a handler being added.
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed {
			nc.Close()
			return
		}
		s.wg.Add(1)
		s.handling.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.handling.Done()
			s.handleConn(nc, config, near)
		}()
	})
	if err == nil {
		return ErrServerClosed
	}
	return err
}

func (s *Server) maxUnacked() int {
	if s.MaxUnacked == 0 {
		return DefaultMaxUnacked
	}
	return s.MaxUnacked
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed || s.stopping
}

// StopAccepting closes the listener (in this process: a next process
// that inherited the socket accepts on it) and returns once the accept
// loop has ended. Unlike Close, a connection that has not run a command
// yet may still run one, and is closed once it is done; connections with
// no command running that already ran one are closed now (a kept
// connection: the client's next one goes to the next process).
// WaitConnections waits for them all.
func (s *Server) StopAccepting() {
	s.mu.Lock()
	s.stopping = true
	done := s.loopDone
	if s.listener != nil {
		s.listener.Close()
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	if done != nil {
		<-done
	}
	for _, c := range conns {
		c.closeWhenDone()
	}
}

// WaitConnections blocks until every connection handler has returned.
func (s *Server) WaitConnections() { s.handling.Wait() }

// Close stops accepting; running requests are drained by the pipeline.
// Connections with no request running are closed now, the others as soon
// as their last request ends, so that Wait returns even when clients keep
// connections open (OpenSSH ControlPersist).
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	if s.stopKeys != nil {
		close(s.stopKeys)
		s.stopKeys = nil
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	var err error
	if s.listener != nil {
		err = s.listener.Close()
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.drain()
	}
	return err
}

// Wait blocks until every connection handler has returned.
func (s *Server) Wait() { s.wg.Wait() }

func (s *Server) log() *slog.Logger {
	if s.Log == nil {
		return slog.Default()
	}
	return s.Log
}

func (s *Server) serverConfig() *gossh.ServerConfig {
	config := &gossh.ServerConfig{
		ServerVersion: ServerVersion,
		// Any key may authenticate: an unknown key is anonymous, and the
		// identity is looked up once the client has proven it holds the key.
		PublicKeyCallback: func(gossh.ConnMetadata, gossh.PublicKey) (*gossh.Permissions, error) {
			return &gossh.Permissions{}, nil
		},
		VerifiedPublicKeyCallback: func(md gossh.ConnMetadata, key gossh.PublicKey, _ *gossh.Permissions, _ string) (*gossh.Permissions, error) {
			p, err := s.Access.PrincipalForKey(context.Background(), key)
			if err != nil {
				// The store could not answer in time: let the client in
				// to be told so (stderr, an exit status), rather than
				// fail its key, which ssh reports as "Permission denied"
				// and answers by trying other keys, or anonymous.
				s.log().Error("key lookup failed", "transport", "ssh", "remote", md.RemoteAddr().String(), "error", err.Error())
				perms := permissionsFor(access.Anonymous, gossh.FingerprintSHA256(key))
				perms.Extensions[extUnavailable] = err.Error()
				return perms, nil
			}
			return permissionsFor(p, gossh.FingerprintSHA256(key)), nil
		},
		// Zero questions: lets a client without keys in (anonymous, read-only).
		KeyboardInteractiveCallback: func(gossh.ConnMetadata, gossh.KeyboardInteractiveChallenge) (*gossh.Permissions, error) {
			return permissionsFor(access.Anonymous, ""), nil
		},
	}
	config.Ciphers = s.Ciphers
	if len(config.Ciphers) == 0 {
		config.Ciphers = DefaultCiphers
	}
	for _, key := range s.HostKeys {
		config.AddHostKey(offeredHostKey(key))
	}
	return config
}

// offeredHostKey restricts an RSA host key to SHA-2 signatures. For an RSA
// key x/crypto/ssh (v0.58) offers rsa-sha2-256, rsa-sha2-512 and ssh-rsa
// (SHA-1 signatures); packwire offers rsa-sha2-512 and rsa-sha2-256 only, as
// OpenSSH's sshd does since 8.8. A client that knows only ssh-rsa can take
// the ECDSA key. Other keys are offered as they are.
func offeredHostKey(key gossh.Signer) gossh.Signer {
	rsaKey, ok := key.(gossh.AlgorithmSigner)
	if !ok || key.PublicKey().Type() != gossh.KeyAlgoRSA {
		return key
	}
	sha2Only, err := gossh.NewSignerWithAlgorithms(rsaKey, []string{gossh.KeyAlgoRSASHA512, gossh.KeyAlgoRSASHA256})
	if err != nil {
		return key // cannot happen for an RSA key
	}
	return sha2Only
}

func permissionsFor(p access.Principal, fingerprint string) *gossh.Permissions {
	return &gossh.Permissions{Extensions: map[string]string{extUser: p.User, extVia: p.Via, extKey: fingerprint}}
}

func principalOf(perms *gossh.Permissions) access.Principal {
	if perms == nil || perms.Extensions[extUser] == "" {
		return access.Anonymous
	}
	return access.Principal{User: perms.Extensions[extUser], Via: perms.Extensions[extVia]}
}

// Timeouts are an SSH connection's deadlines, taken when it is accepted.
type Timeouts struct {
	Init      time.Duration // handshake and first command (0: none)
	KeepAlive time.Duration // between keepalive probes (0: off)
	Idle      time.Duration // after the last command ends (0: never)
}

// SetTimeouts changes the timeouts of the connections accepted from now
// on (a configuration reload); open connections keep theirs.
func (s *Server) SetTimeouts(t Timeouts) { s.timeouts.Store(&t) }

func (s *Server) timeoutsNow() Timeouts {
	if t := s.timeouts.Load(); t != nil {
		return *t
	}
	return Timeouts{Init: s.InitTimeout, KeepAlive: s.KeepAlive, Idle: s.IdleTimeout}
}

// handleConn runs one connection from accept to close. near: the round
// trip is short enough to wait for the client's cipher list (see
// preferCiphers).
func (s *Server) handleConn(nc net.Conn, config *gossh.ServerConfig, near bool) {
	start := time.Now()
	s.accepted.Add(1)
	defer nc.Close()
	remote := nc.RemoteAddr().String()
	log := s.log().With("transport", "ssh", "remote", remote)
	// Closed before the banner, as OpenSSH's sshd does past MaxStartups:
	// SSH has no way to say why before the key exchange.
	started, ok := s.Startups.Begin(nc.RemoteAddr())
	if !ok {
		s.refusals.Note(accept.StartupsReason(s.Startups.Max()), remote)
		s.Penalties.Offend(nc.RemoteAddr(), accept.CostBusy, "over --max-startups-per-address")
		return
	}
	defer started()
	n := s.open.Add(1)
	defer s.open.Add(-1)
	if s.MaxConnections > 0 && n > int64(s.MaxConnections) {
		s.refusals.Note(fmt.Sprintf("too many connections (max %d)", s.MaxConnections), remote)
		return
	}

	t := s.timeoutsNow() // this connection's, whatever a reload does meanwhile
	var deadline time.Time
	if t.Init > 0 {
		deadline = start.Add(t.Init)
		nc.SetDeadline(deadline)
	}
	if near && len(config.Ciphers) > 1 {
		var ciphers []string
		if nc, ciphers = preferCiphers(nc, config.ServerVersion, config.Ciphers, deadline); len(ciphers) < len(config.Ciphers) {
			own := *config
			own.Ciphers = ciphers
			config = &own
		}
	}
	sconn, chans, globalReqs, err := gossh.NewServerConn(nc, config)
	if err != nil {
		s.refusals.NoteError("handshake failed", remote, err)
		s.offendHandshake(nc, err)
		return
	}
	nc.SetDeadline(time.Time{})
	defer sconn.Close()

	principal := principalOf(sconn.Permissions)
	log = log.With("user", principal.String())
	if perms := sconn.Permissions; perms != nil && perms.Extensions[extKey] != "" {
		log = log.With("key", perms.Extensions[extKey])
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := &conn{srv: s, ssh: sconn, ctx: ctx, remote: remote, principal: principal, log: log, started: started, timeouts: t}
	if perms := sconn.Permissions; perms != nil {
		c.keyFingerprint = perms.Extensions[extKey]
		c.unavailable = perms.Extensions[extUnavailable]
	}
	if !s.track(c) {
		return
	}
	defer s.untrack(c)
	defer c.stopIdleTimer()

	// The rest of InitTimeout is for the first command: a connection that
	// authenticates and then sits there holds a slot for nothing.
	if t.Init > 0 {
		c.initTimer = time.AfterFunc(time.Until(start.Add(t.Init)), c.expireInit)
		defer c.initTimer.Stop()
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		sconn.Wait()
		cancel() // requests on this connection end with it
	}()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.serveGlobalRequests(globalReqs)
	}()
	if t.KeepAlive > 0 {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.keepAlive(t.KeepAlive)
		}()
	}
	for newCh := range chans {
		c.openChannel(newCh)
	}
	c.wg.Wait()
}

func (s *Server) track(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.conns == nil {
		s.conns = make(map[*conn]struct{})
	}
	s.conns[c] = struct{}{}
	if s.stopping {
		c.afterCommand = true // the lock order is s.mu, then c.mu
	}
	return true
}

func (s *Server) untrack(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// conn is one authenticated connection. It may carry several sessions at
// once (OpenSSH ControlMaster multiplexes commands over one connection).
type conn struct {
	srv       *Server
	ssh       *gossh.ServerConn
	ctx       context.Context // cancelled when the connection closes
	remote    string
	principal access.Principal
	// keyFingerprint is the key the client authenticated with ("": none).
	keyFingerprint string
	// unavailable: why the key's owner is unknown (the store did not
	// answer); "": known. Every command is refused, to retry later.
	unavailable string
	log         *slog.Logger
	timeouts    Timeouts // the server's when the connection was accepted
	initTimer   *time.Timer
	started     func()         // the first command is here: no longer among its address's startups
	wg          sync.WaitGroup // everything started for this connection

	mu         sync.Mutex
	sawCommand bool
	running    int         // sessions with a command in progress
	sessions   int         // session channels open, counted against MaxSessions
	refusals   int         // session channels refused over MaxSessions
	lastActive time.Time   // last command end or channel open, for IdleTimeout
	idleTimer  *time.Timer // from the first command's end; nil without IdleTimeout
	draining   bool        // server closed: close once running is 0
	// afterCommand: the server hands over (StopAccepting): close once a
	// command has run and none is running.
	afterCommand bool
	revoked      string // why the key no longer stands for principal ("": it does); see revoke
}

// offendHandshake charges the address of a connection whose handshake
// failed: a timeout as grace exceeded, a close as nothing (a port check,
// or a client that gave up, on a changed host key say), anything else as
// a protocol error.
func (s *Server) offendHandshake(nc net.Conn, err error) {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		s.Penalties.Offend(nc.RemoteAddr(), accept.CostTimeout, "no handshake within --init-timeout")
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
	default:
		s.Penalties.Offend(nc.RemoteAddr(), accept.CostProtocol, "SSH handshake failed")
	}
}

// expireInit closes a connection that sent no command within InitTimeout.
func (c *conn) expireInit() {
	c.mu.Lock()
	expired := !c.sawCommand
	c.mu.Unlock()
	if expired {
		c.log.Info("connection closed", "reason", "no command within the init timeout", "timeout", c.timeouts.Init.String())
		c.srv.Penalties.Offend(c.ssh.RemoteAddr(), accept.CostTimeout, "no command within --init-timeout")
		c.ssh.Close()
	}
}

// beginCommand records a command starting.
func (c *conn) beginCommand() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.sawCommand {
		c.sawCommand = true
		if c.initTimer != nil {
			c.initTimer.Stop()
		}
		if c.started != nil {
			c.started()
		}
	}
	c.running++
}

func (c *conn) endCommand() {
	c.mu.Lock()
	c.running--
	if timeout := c.timeouts.Idle; c.running == 0 && timeout > 0 {
		// Before the first command InitTimeout applies: a client may be
		// slow between authentication and its first channel.
		c.lastActive = time.Now()
		if c.idleTimer == nil {
			c.idleTimer = time.AfterFunc(timeout, c.expireIdle)
		} else {
			c.idleTimer.Reset(timeout)
		}
	}
	idle := (c.draining || c.afterCommand) && c.running == 0
	c.mu.Unlock()
	if idle {
		c.closeAfterClient()
	}
}

// lingerClose bounds how long a connection closed right after its last
// command waits for the client to close it first.
const lingerClose = 5 * time.Second

// closeAfterClient closes a connection whose last command just ended (a
// drain or a hand-over), once the client closed it or after lingerClose.
// Closed at once, the socket still held what the client sent meanwhile
// (window adjusts), and a close with unread input is a reset: the
// client's kernel then drops the end of the pack it had not read yet
// ("Connection closed by remote host", "early EOF": TestRestartDropsNothing).
func (c *conn) closeAfterClient() {
	go func() {
		done := make(chan struct{})
		go func() { c.ssh.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(lingerClose):
		}
		c.ssh.Close()
	}()
}

// closeWhenDone closes the connection now if it ran a command and runs
// none, else once its commands are done (StopAccepting).
func (c *conn) closeWhenDone() {
	c.mu.Lock()
	c.afterCommand = true
	idle := c.sawCommand && c.running == 0
	c.mu.Unlock()
	if idle {
		c.ssh.Close()
	}
}

func (c *conn) commandRunning() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.running > 0
}

func (c *conn) stopIdleTimer() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.idleTimer != nil {
		c.idleTimer.Stop()
	}
}

// expireIdle closes a connection on which no command ran for IdleTimeout.
// A connection kept for reuse (OpenSSH ControlPersist) costs a goroutine set
// and a slot of MaxConnections; its client opens a new one when it needs it.
func (c *conn) expireIdle() {
	c.mu.Lock()
	if c.running > 0 || c.ctx.Err() != nil {
		c.mu.Unlock()
		return // endCommand starts the timer again, or the connection is gone
	}
	if left := c.timeouts.Idle - time.Since(c.lastActive); left > 0 {
		c.idleTimer.Reset(left) // a channel opened since the timer was set
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.log.Info("connection closed", "reason", "idle: no command running", "timeout", c.timeouts.Idle.String())
	c.ssh.Close()
}

// openSession counts a new session channel against MaxSessions; it reports
// false when the connection has as many open as it may, and whether this is
// the connection's first such refusal.
func (c *conn) openSession() (ok, firstRefusal bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if limit := c.srv.MaxSessions; limit > 0 && c.sessions >= limit {
		c.refusals++
		return false, c.refusals == 1
	}
	c.sessions++
	c.lastActive = time.Now() // its command comes next: not idle
	return true, false
}

func (c *conn) closeSession() {
	c.mu.Lock()
	c.sessions--
	closeNow := c.revoked != "" && c.sessions == 0 && c.running == 0
	reason := c.revoked
	c.mu.Unlock()
	if closeNow {
		c.log.Info("connection closed", "reason", reason)
		c.ssh.Close()
	}
}

func (c *conn) drain() {
	c.mu.Lock()
	c.draining = true
	idle := c.running == 0
	c.mu.Unlock()
	if idle {
		c.ssh.Close()
	}
}

func (c *conn) isDraining() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.draining
}

// serveGlobalRequests refuses everything: packwire offers no forwarding, and
// a client's own keepalives only need an answer, which a refusal is.
func (c *conn) serveGlobalRequests(reqs <-chan *gossh.Request) {
	for req := range reqs {
		if req.Type == "tcpip-forward" || req.Type == "streamlocal-forward@openssh.com" {
			c.log.Info("refused", "reason", "remote port forwarding is not supported", "request", req.Type)
		}
		req.Reply(false, nil) // a no-op unless the client wants a reply
	}
}

// keepAlive probes the client every interval and closes the connection when
// keepAliveMisses probes in a row went unanswered while no command ran: a
// client that vanished without a FIN would otherwise hold the connection
// until TCP gives up.
func (c *conn) keepAlive(interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	answered := make(chan struct{}, 1)
	answered <- struct{}{} // no probe outstanding
	missed := 0
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		select {
		case <-answered:
			missed = 0
			c.wg.Add(1)
			go func() {
				defer c.wg.Done()
				// Any answer counts, a refusal included (OpenSSH refuses it).
				if _, _, err := c.ssh.SendRequest("keepalive@openssh.com", true, nil); err == nil {
					answered <- struct{}{}
				}
			}()
		default: // the last probe is still unanswered
			if c.commandRunning() {
				// libssh2 reads, keepalive replies included, only when its
				// application does, and a client may pause reading while
				// git still has data for it: silence is no sign of a dead
				// peer then. TCP keepalive finds a vanished one.
				missed = 0
				continue
			}
			if missed++; missed >= keepAliveMisses {
				c.log.Info("connection closed", "reason", "keepalive unanswered", "missed", missed, "interval", interval.String())
				c.ssh.Close()
				return
			}
		}
	}
}

// openChannel accepts session channels and refuses the rest (forwarding).
func (c *conn) openChannel(newCh gossh.NewChannel) {
	switch typ := newCh.ChannelType(); {
	case typ != "session":
		c.log.Info("refused", "reason", "channel type not supported", "channel", typ)
		newCh.Reject(gossh.Prohibited, "packwire: port forwarding is not supported")
	case c.isDraining():
		newCh.Reject(gossh.ResourceShortage, "packwire: server is shutting down, retry shortly")
	case c.revocation() != "":
		newCh.Reject(gossh.Prohibited, "packwire: "+c.revocation()+"; connect again")
	default:
		// As OpenSSH's MaxSessions: each session may run a git.
		if ok, first := c.openSession(); !ok {
			reason := fmt.Sprintf("too many sessions on this connection (max %d)", c.srv.MaxSessions)
			level := slog.LevelWarn
			if !first {
				level = slog.LevelDebug // a flood of opens is not a flood of log lines
			}
			c.log.Log(context.Background(), level, "refused", "reason", reason)
			newCh.Reject(gossh.ResourceShortage, "packwire: "+reason)
			return
		}
		ch, reqs, err := newCh.Accept()
		if err != nil {
			c.closeSession()
			return
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			defer c.closeSession()
			c.serveSession(ch, reqs)
		}()
	}
}

// CheckCiphers reports the first name in ciphers that x/crypto/ssh does
// not implement: it would drop it silently, and a list of such names
// leaves the server offering none, refusing every client.
func CheckCiphers(ciphers []string) error {
	known := append(gossh.SupportedAlgorithms().Ciphers, gossh.InsecureAlgorithms().Ciphers...)
	for _, c := range ciphers {
		if !slices.Contains(known, c) {
			return fmt.Errorf("unknown cipher %q: the ciphers are %s (and, with known weaknesses, %s)", c,
				strings.Join(gossh.SupportedAlgorithms().Ciphers, ", "), strings.Join(gossh.InsecureAlgorithms().Ciphers, ", "))
		}
	}
	return nil
}
