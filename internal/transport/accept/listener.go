package accept

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// maxRefusing bounds the refusals answered at once. Each holds a descriptor
// for a few seconds; past this a flood of connections is closed unanswered.
const maxRefusing = 128

// Listener is a net.Listener for servers that call Accept themselves
// (net/http). It retries transient accept errors as Loop does, so the
// server never sees them, and it caps the connections open at once: one
// over the cap is handed to refuse in a goroutine of its own and never
// reaches the server, so net/http's hijacking and TLS never meet it.
// Connections count from Accept until their Close.
//
// Startups, when set before the first Accept, bounds per address the
// connections that have not sent a request yet: one over it is handed to
// refuse too, with its own reason, and counts against nothing. The server
// reports a request's arrival with Started.
//
// Penalties, when set before the first Accept, closes the connections of
// penalized addresses as they are accepted; an address over Startups is
// charged for it.
type Listener struct {
	net.Listener
	Startups  *Startups
	Penalties *Penalties
	max       int64
	refuse    func(c net.Conn, msg string)
	log       *slog.Logger

	open      atomic.Int64
	refusing  refusals
	refusals  RefusalLog
	done      chan struct{}
	closeOnce sync.Once
	backoff   *backoff
}

// NewListener wraps l. max <= 0 means no cap. refuse answers a connection
// over a bound with msg, the reason in git's words (it is closed after
// refuse returns); nil closes it at once. log (nil: slog.Default) gets the
// refusals and the accept episodes.
func NewListener(l net.Listener, max int, refuse func(c net.Conn, msg string), log *slog.Logger) *Listener {
	if log == nil {
		log = slog.Default()
	}
	return &Listener{Listener: l, max: int64(max), refuse: refuse, log: log, refusals: RefusalLog{Log: log},
		done: make(chan struct{}), backoff: &backoff{log: log, addr: l.Addr()}}
}

// Accept returns the next connection under the cap.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if !Transient(err) {
				return nil, err
			}
			t := time.NewTimer(l.backoff.failed(err))
			select {
			case <-t.C:
			case <-l.done: // the next Accept reports the close
			}
			t.Stop()
			continue
		}
		l.backoff.succeeded()
		if l.Penalties.Refused(c.RemoteAddr()) {
			l.Penalties.Reject(c)
			continue
		}
		started, ok := l.Startups.Begin(c.RemoteAddr())
		if !ok {
			l.refusals.Note(StartupsReason(l.Startups.Max()), c.RemoteAddr().String())
			l.Penalties.Offend(c.RemoteAddr(), CostBusy, "over --max-startups-per-address")
			l.refusing.answer(c, l.answer(StartupsMessage(l.Startups.Max())))
			continue
		}
		conn := &countedConn{Conn: c, open: &l.open, started: started}
		if n := l.open.Add(1); l.max > 0 && n > l.max {
			l.turnAway(conn)
			continue
		}
		return conn, nil
	}
}

// Close closes the listener and ends a backoff pause at once.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() {
		close(l.done)
		l.backoff.stop()
		l.refusals.Stop()
	})
	return l.Listener.Close()
}

// Open is the number of connections open now, refused ones being answered
// included.
func (l *Listener) Open() int { return int(l.open.Load()) }

func (l *Listener) turnAway(c net.Conn) {
	l.refusals.Note(fmt.Sprintf("too many connections (max %d)", l.max), c.RemoteAddr().String())
	l.refusing.answer(c, l.answer(BusyMessage(int(l.max))))
}

// answer is refuse with msg, or nil when there is no refuse.
func (l *Listener) answer(msg string) func(net.Conn) {
	if l.refuse == nil {
		return nil
	}
	return func(c net.Conn) { l.refuse(c, msg) }
}

// countedConn gives its slot back on the first Close, and its place among
// its address's startups on Started or Close.
type countedConn struct {
	net.Conn
	open    *atomic.Int64
	started func()
	closed  atomic.Bool
}

func (c *countedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.open.Add(-1)
		c.started()
	}
	return c.Conn.Close()
}

type connKey struct{}

// ConnContext is for net/http's Server.ConnContext: it keeps the
// connection in its requests' context for Started.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// Started reports that the connection of a request with a ConnContext
// context has sent a complete request: it no longer counts among its
// address's startups.
func Started(ctx context.Context) {
	c, _ := ctx.Value(connKey{}).(net.Conn)
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if cc, ok := c.(*countedConn); ok {
		cc.started()
	}
}

// BusyMessage is the refusal of a connection over --max-connections, as
// git shows it after "remote:" or "remote error:".
func BusyMessage(max int) string {
	return fmt.Sprintf("server busy: too many connections (max %d), retry later", max)
}

// StartupsReason is what the log says of a connection refused by Startups.
func StartupsReason(max int) string {
	return fmt.Sprintf("too many connections from this address that have not sent a request yet (max %d)", max)
}

// StartupsMessage is the refusal of a connection over Startups' bound.
func StartupsMessage(max int) string {
	return fmt.Sprintf("server busy: too many connections from your address that have not sent a request yet (max %d), retry later", max)
}

// ReadFrom keeps sendfile: net/http uses it when the connection has it.
func (c *countedConn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

// CloseWrite keeps net/http's graceful close: it half-closes before it
// closes, so that the client reads the last answer instead of a reset.
func (c *countedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// NetConn is the connection under the count (as tls.Conn's), for what
// needs the socket itself.
func (c *countedConn) NetConn() net.Conn { return c.Conn }
