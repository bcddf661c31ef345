// Package httpdrain ends an http.Server's connections for a hand over
// without losing a request on its way.
//
// http.Server.Shutdown closes every connection it finds idle, but a
// kept-alive connection is "idle" until the next request's header has been
// read whole: a client that sent its request just then gets no answer
// ("Empty reply from server"), and a request read after Shutdown began is
// dropped unanswered (golang/go#65802). curl retries such a request only
// when it can replay it, which git's POSTs often cannot.
//
// Drain does what nginx does instead: it stops accepting, goes on serving
// the connections it has, answers each request from then on with
// "Connection: close" (the connection ends after that answer), and closes
// a connection only once it has been idle for a while with nothing unread
// on its socket. Only then does the caller run Shutdown, which finds
// nothing of HTTP/1 left (HTTP/2 connections get their GOAWAY from it).
package httpdrain

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Tracker follows an http.Server's connections: set ConnState as the
// server's ConnState, wrap its handler with Handler and its listener with
// Listener.
type Tracker struct {
	mu       sync.Mutex
	conns    map[net.Conn]*conn
	changed  chan struct{} // a token on every change of state
	draining atomic.Bool
}

type conn struct {
	state http.ConnState
	since time.Time // when it entered state
}

// New returns an empty Tracker.
func New() *Tracker {
	return &Tracker{conns: map[net.Conn]*conn{}, changed: make(chan struct{}, 1)}
}

// ConnState is for http.Server.ConnState.
func (t *Tracker) ConnState(c net.Conn, state http.ConnState) {
	t.mu.Lock()
	switch state {
	case http.StateClosed, http.StateHijacked:
		delete(t.conns, c)
	default:
		t.conns[c] = &conn{state: state, since: time.Now()}
	}
	t.mu.Unlock()
	select {
	case t.changed <- struct{}{}:
	default:
	}
}

// Handler answers every HTTP/1 request that starts while draining with
// "Connection: close": net/http then closes the connection after the
// answer, and the client's next request opens a new one (on the next
// process).
func (t *Tracker) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if t.draining.Load() && r.ProtoMajor == 1 {
			w.Header().Set("Connection", "close")
		}
		next.ServeHTTP(w, r)
	})
}

// Listener wraps the listener the server accepts on so that Drain can
// stop the accept loop without Shutdown: after Drain closes it, Accept
// fails with http.ErrServerClosed, which Serve returns.
func (t *Tracker) Listener(l net.Listener) net.Listener {
	return &listener{Listener: l, t: t}
}

type listener struct {
	net.Listener
	t    *Tracker
	once sync.Once
	err  error
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil && l.t.draining.Load() {
		return nil, http.ErrServerClosed
	}
	return c, err
}

func (l *listener) Close() error {
	l.once.Do(func() { l.err = l.Listener.Close() })
	return l.err
}

// Drain stops accepting on every Listener of t (a next process that
// inherited the socket accepts on it), then serves the connections
// accepted until each has ended: closed by its client, or closed after its
// answer (Handler), or idle (or waiting for its first request) for
// idleFor, when Drain closes it unless a request has reached its socket.
// It returns when none is left but connections that never sent a request
// in idleFor (HTTP/2 ones among them), or when ctx ends.
func (t *Tracker) Drain(ctx context.Context, ls []net.Listener, idleFor time.Duration) {
	t.draining.Store(true)
	for _, l := range ls {
		l.Close()
	}
	for {
		next, left := t.closeIdle(idleFor)
		if left == 0 {
			return
		}
		timer := time.NewTimer(next)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-t.changed:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// closeIdle closes the connections idle for idleFor with nothing unread,
// and says how many are left and when one will next have been idle long
// enough.
func (t *Tracker) closeIdle(idleFor time.Duration) (next time.Duration, left int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	next = idleFor
	now := time.Now()
	for c, st := range t.conns {
		if st.state == http.StateActive {
			left++
			continue
		}
		// New or idle: a request may be on its way.
		if wait := st.since.Add(idleFor).Sub(now); wait > 0 {
			next = min(next, wait)
			left++
			continue
		}
		if st.state == http.StateNew {
			// No request in idleFor, or HTTP/2 (whose hooks stop at
			// New): left to Shutdown, which sends HTTP/2 its GOAWAY.
			continue
		}
		if pending(c) {
			// Its request has arrived but net/http has not read it
			// yet: it will go active and be answered.
			st.since = now
			next = min(next, idleFor)
			left++
			continue
		}
		c.Close()
		delete(t.conns, c)
	}
	return max(next, 10*time.Millisecond), left
}

// pending says whether bytes wait unread in c's socket.
func pending(c net.Conn) bool {
	for {
		switch u := c.(type) {
		case *tls.Conn:
			c = u.NetConn()
			continue
		case interface{ NetConn() net.Conn }:
			c = u.NetConn()
			continue
		}
		break
	}
	n, err := unread(c)
	return err == nil && n > 0
}

var errNoSocket = errors.New("not a socket")
