// Package accept is what the transports' listeners share: an accept loop
// (git://, SSH) and a listener wrapper (HTTP) that ride out transient
// accept failures, such as running out of file descriptors, with a capped
// backoff and tell a listener closed on purpose from one that failed; a
// connection cap for HTTP; a bound per address on connections that have
// not sent their request yet (Startups); TCP quick ACKs.
package accept

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"
)

// Loop accepts connections on l and passes each to start, which must not
// block (it starts the connection's goroutine). Transient errors (see
// Transient) are retried with a backoff and logged on log (nil:
// slog.Default) once per episode: when it starts, and when accepts have
// worked again for a while. It returns nil once closed reports that l was
// closed on purpose, or the fatal error that stopped it.
func Loop(l net.Listener, log *slog.Logger, closed func() bool, start func(net.Conn)) error {
	b := &backoff{log: log, addr: l.Addr()}
	defer b.stop()
	for {
		conn, err := l.Accept()
		if err != nil {
			if closed() {
				return nil
			}
			if Transient(err) {
				time.Sleep(b.failed(err))
				continue
			}
			return err
		}
		b.succeeded()
		start(conn)
	}
}

// transientErrnos are the accept errors after which the listener still
// works: out of descriptors, buffers or memory (they come back when
// connections close), a connection that died in the backlog, a signal, and
// the pending network errors Linux's accept(2) passes on ("treat them like
// EAGAIN by retrying"), EPERM included (a firewall rule refused it).
var transientErrnos = []error{
	syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM,
	syscall.ECONNABORTED, syscall.ECONNRESET, syscall.EINTR, syscall.EAGAIN,
	syscall.EPROTO, syscall.ENOPROTOOPT, syscall.ENETDOWN, syscall.ENETUNREACH,
	syscall.EHOSTDOWN, syscall.EHOSTUNREACH, syscall.EOPNOTSUPP, syscall.ETIMEDOUT,
	syscall.EPERM,
}

// Transient reports whether an accept error is worth retrying. Anything
// else (the listener closed, EBADF, EINVAL, ENOTSOCK) is fatal: retrying it
// would spin on a listener that can never accept again.
func Transient(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	for _, e := range transientErrnos {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Backoff as net/http's Server.Serve paces it: 5 ms, doubling up to 1 s.
const (
	firstDelay = 5 * time.Millisecond
	maxDelay   = time.Second
)

// episodeQuiet is how long accepts must work before an episode counts as
// over. Descriptors often come back one at a time (each idle connection
// closing frees one, which the next pending connection takes), so accept
// flaps between working and failing; that is one episode, not many.
var episodeQuiet = 2 * time.Second

// backoff paces the retries of a failing accept. An episode is logged when
// it starts and when it is over, never per retry: descriptor exhaustion
// lasts as long as the connections holding them, and a line per retry
// would drown the log.
type backoff struct {
	log  *slog.Logger
	addr net.Addr

	mu       sync.Mutex
	delay    time.Duration // the last pause; 0 after a success
	failing  bool          // in an episode
	since    time.Time     // its first failure
	lastFail time.Time
	retries  int
	gen      int         // invalidates a pending settle timer
	settle   *time.Timer // ends the episode after episodeQuiet without a failure
}

// failed returns how long to wait before the next accept.
func (b *backoff) failed(err error) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	if !b.failing {
		b.failing, b.since, b.retries = true, now, 0
		b.logger().Warn("accept failing, retrying with backoff until it recovers (logged once)",
			"listener", b.addr.String(), "error", err.Error())
	}
	b.stopSettle()
	b.lastFail = now
	b.retries++
	if b.delay == 0 {
		b.delay = firstDelay
	} else {
		b.delay = min(2*b.delay, maxDelay)
	}
	return b.delay
}

// succeeded resets the pause and, in an episode, ends it once accepts
// keep working for episodeQuiet.
func (b *backoff) succeeded() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.delay = 0
	if b.failing && b.settle == nil {
		gen := b.gen
		b.settle = time.AfterFunc(episodeQuiet, func() { b.end(gen) })
	}
}

func (b *backoff) end(gen int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if gen != b.gen || !b.failing {
		return // a failure came since
	}
	b.failing, b.settle = false, nil
	b.logger().Info("accept recovered", "listener", b.addr.String(),
		"failing_for", b.lastFail.Sub(b.since).Round(time.Millisecond).String(), "retries", b.retries)
}

// stop drops a pending end of episode: the listener is gone.
func (b *backoff) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stopSettle()
}

func (b *backoff) stopSettle() {
	b.gen++
	if b.settle != nil {
		b.settle.Stop()
		b.settle = nil
	}
}

func (b *backoff) logger() *slog.Logger {
	if b.log == nil {
		return slog.Default()
	}
	return b.log
}
