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
// does, until mend; onUp, if set, sees each chunk the client sends
// before it is forwarded.
type testProxy struct {
	ln       net.Listener
	upstream atomic.Value // string
	onUp     atomic.Value // func([]byte)
	mu       sync.Mutex
	open     chan struct{} // closed while bytes move
	conns    []net.Conn
}

func newTestProxy(t *testing.T, upstream string) *testProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &testProxy{ln: ln, open: make(chan struct{})}
	close(p.open)
	p.upstream.Store(upstream)
	t.Cleanup(func() {
		ln.Close()
		p.mend()
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

// gate waits while a cut lasts.
func (p *testProxy) gate() {
	p.mu.Lock()
	open := p.open
	p.mu.Unlock()
	<-open
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
	p.gate()
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
				p.gate()
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
