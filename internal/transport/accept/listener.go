package accept

import (
	"errors"
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
type Listener struct {
	net.Listener
	max    int64
	refuse func(net.Conn)
	log    *slog.Logger

	open      atomic.Int64
	refusing  atomic.Int64
	done      chan struct{}
	closeOnce sync.Once
	backoff   *backoff
}

// NewListener wraps l. max <= 0 means no cap. refuse answers a connection
// over the cap (it is closed after refuse returns); nil closes it at once.
// log (nil: slog.Default) gets the refusals and the accept episodes.
func NewListener(l net.Listener, max int, refuse func(net.Conn), log *slog.Logger) *Listener {
	if log == nil {
		log = slog.Default()
	}
	return &Listener{Listener: l, max: int64(max), refuse: refuse, log: log,
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
		conn := &countedConn{Conn: c, open: &l.open}
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
	})
	return l.Listener.Close()
}

// Open is the number of connections open now, refused ones being answered
// included.
func (l *Listener) Open() int { return int(l.open.Load()) }

func (l *Listener) turnAway(c net.Conn) {
	l.log.Warn("connection refused: too many connections", "remote", c.RemoteAddr().String(), "max", l.max)
	if l.refuse == nil {
		c.Close()
		return
	}
	if l.refusing.Add(1) > maxRefusing {
		l.refusing.Add(-1)
		c.Close()
		return
	}
	go func() {
		defer l.refusing.Add(-1)
		defer c.Close()
		l.refuse(c)
	}()
}

// countedConn gives its slot back on the first Close.
type countedConn struct {
	net.Conn
	open   *atomic.Int64
	closed atomic.Bool
}

func (c *countedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.open.Add(-1)
	}
	return c.Conn.Close()
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
