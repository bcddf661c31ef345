package gittest

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// SlowProxy is a slow network between a client and a server, for tests
// that need a real request to stay in flight: it relays each connection to
// the target, passing what the server sends at about BytesPerSecond until
// Release. What the client sends passes at once.
type SlowProxy struct {
	Addr string // 127.0.0.1:port to connect to instead of the target

	bytesPerSecond int
	accepted       atomic.Int64
	released       atomic.Bool
	wake           chan struct{}
	once           sync.Once
}

// NewSlowProxy starts a proxy to target; it stops when the test ends.
func NewSlowProxy(t testing.TB, target string, bytesPerSecond int) *SlowProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &SlowProxy{Addr: l.Addr().String(), bytesPerSecond: max(bytesPerSecond, 10), wake: make(chan struct{})}
	var conns sync.WaitGroup
	t.Cleanup(func() {
		p.Release()
		l.Close()
		conns.Wait()
	})
	go func() {
		for {
			client, err := l.Accept()
			if err != nil {
				return
			}
			p.accepted.Add(1)
			conns.Add(1)
			go func() {
				defer conns.Done()
				p.relay(client, target)
			}()
		}
	}()
	return p
}

// Accepted is how many connections clients have opened through the proxy.
func (p *SlowProxy) Accepted() int64 { return p.accepted.Load() }

// Release lets everything through at full speed from now on.
func (p *SlowProxy) Release() {
	p.once.Do(func() {
		p.released.Store(true)
		close(p.wake)
	})
}

func (p *SlowProxy) relay(client net.Conn, target string) {
	defer client.Close()
	server, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer server.Close()
	go func() {
		io.Copy(server, client)
		if tc, ok := server.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
	}()
	const tick = 50 * time.Millisecond
	chunk := max(p.bytesPerSecond/int(time.Second/tick), 1)
	buf := make([]byte, 64<<10)
	for {
		n := len(buf)
		if !p.released.Load() {
			n = min(n, chunk)
		}
		got, err := server.Read(buf[:n])
		if got > 0 {
			if _, werr := client.Write(buf[:got]); werr != nil {
				return
			}
		}
		if err != nil {
			if tc, ok := client.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
			return
		}
		if !p.released.Load() {
			select {
			case <-time.After(tick):
			case <-p.wake:
			}
		}
	}
}
