package main

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// testProxy forwards TCP connections to upstream (settable once the
// target runs). cut stops every byte either way (connections stay open,
// new ones are accepted and held), as a network that drops every packet
// does, until mend; cutWhere does the same to the connections it picks
// only (a partition of some clients); onUp, if set, sees each chunk the
// client sends before it is forwarded.
type testProxy struct {
	ln       net.Listener
	upstream atomic.Value // string
	onUp     atomic.Value // func([]byte)
	mu       sync.Mutex
	open     chan struct{} // closed while bytes move
	where    func(client net.Conn) bool
	changed  chan struct{} // closed and replaced when where changes
	conns    []net.Conn
}

func newTestProxy(t *testing.T, upstream string) *testProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &testProxy{ln: ln, open: make(chan struct{}), changed: make(chan struct{})}
	close(p.open)
	p.upstream.Store(upstream)
	t.Cleanup(func() {
		ln.Close()
		p.mend()
		p.cutWhere(nil)
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.forward(c)
		}
	}()
	return p
}

func (p *testProxy) addr() string { return p.ln.Addr().String() }

func (p *testProxy) track(c net.Conn) {
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
}

// gate waits while a cut lasts, or one of client's.
func (p *testProxy) gate(client net.Conn) {
	for {
		p.mu.Lock()
		open, where, changed := p.open, p.where, p.changed
		p.mu.Unlock()
		<-open
		if where == nil || !where(client) {
			return
		}
		<-changed
	}
}

// cutWhere holds the bytes of the client connections where picks (nil:
// none), open ones included, until it changes.
func (p *testProxy) cutWhere(where func(client net.Conn) bool) {
	p.mu.Lock()
	p.where = where
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

func (p *testProxy) cut() {
	p.mu.Lock()
	select {
	case <-p.open:
		p.open = make(chan struct{})
	default:
	}
	p.mu.Unlock()
}

func (p *testProxy) mend() {
	p.mu.Lock()
	select {
	case <-p.open:
	default:
		close(p.open)
	}
	p.mu.Unlock()
}

func (p *testProxy) forward(c net.Conn) {
	p.track(c)
	p.gate(c)
	up, err := net.Dial("tcp", p.upstream.Load().(string))
	if err != nil {
		c.Close()
		return
	}
	p.track(up)
	pipe := func(dst, src net.Conn, watch bool) {
		defer dst.Close()
		defer src.Close()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if f, _ := p.onUp.Load().(func([]byte)); watch && f != nil {
					f(buf[:n])
				}
				p.gate(c)
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	go pipe(up, c, true)
	pipe(c, up, false)
}
