//go:build linux

package main

import (
	"io"
	"net"
	"sync"

	"packwire/internal/netowner"
)

// proxy is a TCP proxy on 127.0.0.1 the suite puts between a node and
// what it talks to (PostgreSQL, the other nodes). A blocked connection is
// a silent cut: bytes stop moving both ways and nothing is closed, as in
// a network partition; unblocked, they move again. Which connections are
// blocked is asked per connection and source node (cut), so one proxy in
// front of a node can cut one peer off and not another.
type proxy struct {
	ln     net.Listener
	target func() string // where connections go: read at each new connection

	mu      sync.Mutex
	changed chan struct{} // closed and replaced whenever cut changes
	cut     func(source string) bool
	source  func(remote net.Addr) string // the node that opened a connection, or ""
}

func newProxy(target func() string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, changed: make(chan struct{})}
	go p.serve()
	return p, nil
}

func (p *proxy) Addr() string { return p.ln.Addr().String() }

func (p *proxy) Close() { p.ln.Close() }

// setCut makes connections from the sources cut says stop moving bytes
// (nil: none).
func (p *proxy) setCut(cut func(source string) bool) {
	p.mu.Lock()
	p.cut = cut
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

// waitOpen returns once a connection from source may move bytes, or the
// connection is closed. The source is found when a cut first asks (it
// costs a walk of /proc), for connections opened before the cut too
// (nodes keep theirs alive).
func (p *proxy) waitOpen(source func() string, closed <-chan struct{}) bool {
	for {
		p.mu.Lock()
		cut, changed := p.cut, p.changed
		p.mu.Unlock()
		if cut == nil || !cut(source()) {
			return true
		}
		select {
		case <-changed:
		case <-closed:
			return false
		}
	}
}

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

func (p *proxy) handle(c net.Conn) {
	defer c.Close()
	source := sync.OnceValue(func() string {
		if p.source == nil {
			return ""
		}
		return p.source(c.RemoteAddr())
	})
	closed := make(chan struct{})
	defer close(closed)
	if !p.waitOpen(source, closed) {
		return
	}
	up, err := net.Dial("tcp", p.target())
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	// pump copies one way; at the end of its input it half-closes the
	// other side, on an error it closes both (the other pump ends too).
	pump := func(dst, src net.Conn) {
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if !p.waitOpen(source, closed) {
					return
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					c.Close()
					up.Close()
					return
				}
			}
			if err == io.EOF {
				dst.(*net.TCPConn).CloseWrite()
				return
			}
			if err != nil {
				c.Close()
				up.Close()
				return
			}
		}
	}
	go pump(up, c)
	go pump(c, up)
	<-done
	<-done
}

// sourceNode finds which node opened a loopback connection: the process
// owning the socket at remote, among the nodes and their descendants
// (catch-up runs git fetch, a child of the node).
func sourceNode(remote net.Addr, nodes func() map[int]string) string {
	addr, ok := remote.(*net.TCPAddr)
	if !ok {
		return ""
	}
	byPid := nodes()
	var roots []int
	for pid := range byPid {
		roots = append(roots, pid)
	}
	pid := netowner.OwnerAmong(addr.Port, roots)
	for i := 0; pid > 1 && i < 16; i++ {
		if name, ok := byPid[pid]; ok {
			return name
		}
		pid = netowner.ParentPid(pid)
	}
	return ""
}
