// Package accept is what the transports' listeners share: an accept loop
// (git://, SSH) and a listener wrapper (HTTP) that ride out transient
// accept failures, such as running out of file descriptors, with a capped
// backoff and tell a listener closed on purpose from one that failed; a
// connection cap for HTTP; TCP quick ACKs.
package accept

import (
	"errors"
	"log/slog"
	"net"
	"syscall"
	"time"
)

// Loop accepts connections on l and passes each to start, which must not
// block (it starts the connection's goroutine). Transient errors (see
// Transient) are retried with a backoff and logged once per episode on log
// (nil: slog.Default). It returns nil once closed reports that l was
// closed on purpose, or the fatal error that stopped it.
func Loop(l net.Listener, log *slog.Logger, closed func() bool, start func(net.Conn)) error {
	b := backoff{log: log, addr: l.Addr()}
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
		b.recovered()
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

// backoff paces the retries of a failing accept. An episode is logged when
// it starts and when it ends, never per retry: descriptor exhaustion lasts
// as long as the connections holding them, and a line per second (or per 5
// ms at first) would drown the log.
type backoff struct {
	log     *slog.Logger
	addr    net.Addr
	delay   time.Duration
	since   time.Time
	retries int
}

// failed returns how long to wait before the next accept.
func (b *backoff) failed(err error) time.Duration {
	if b.delay == 0 {
		b.delay, b.since, b.retries = firstDelay, time.Now(), 0
		b.logger().Warn("accept failing, retrying with backoff until it recovers (logged once)",
			"listener", b.addr.String(), "error", err.Error())
	} else {
		b.delay = min(2*b.delay, maxDelay)
	}
	b.retries++
	return b.delay
}

// recovered ends an episode, if one was running.
func (b *backoff) recovered() {
	if b.delay == 0 {
		return
	}
	b.logger().Info("accept recovered", "listener", b.addr.String(),
		"failing_for", time.Since(b.since).Round(time.Millisecond).String(), "retries", b.retries)
	b.delay = 0
}

func (b *backoff) logger() *slog.Logger {
	if b.log == nil {
		return slog.Default()
	}
	return b.log
}
