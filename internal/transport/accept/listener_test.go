package accept

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestListenerCap: connections over the cap go to refuse and never to the
// caller; a connection counts until its first Close (a second one gives
// nothing back); the wrapper keeps sendfile (io.ReaderFrom) and half-close.
func TestListenerCap(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	refused := make(chan string, 10)
	l := NewListener(inner, 2, func(c net.Conn, _ string) {
		io.WriteString(c, "busy\n")
		refused <- c.RemoteAddr().String()
	}, slog.New(slog.NewTextHandler(logs, nil)))
	defer l.Close()

	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	first, second := dial(), dial()
	a1, a2 := <-accepted, <-accepted
	_, _ = first, second
	for _, c := range []net.Conn{a1, a2} {
		if _, ok := c.(io.ReaderFrom); !ok {
			t.Fatal("a counted connection lost io.ReaderFrom (net/http's sendfile path)")
		}
		if _, ok := c.(interface{ CloseWrite() error }); !ok {
			t.Fatal("a counted connection lost CloseWrite")
		}
	}
	third := dial()
	third.SetReadDeadline(time.Now().Add(10 * time.Second))
	if b, _ := io.ReadAll(third); string(b) != "busy\n" {
		t.Fatalf("over the cap: got %q", b)
	}
	<-refused
	if !strings.Contains(logs.String(), `msg="connection refused" reason="too many connections (max 2)"`) {
		t.Fatalf("refusal not logged:\n%s", logs.String())
	}
	select {
	case c := <-accepted:
		t.Fatalf("a connection over the cap reached the caller: %v", c.RemoteAddr())
	default:
	}
	// Closing twice frees one slot, not two.
	a1.Close()
	a1.Close()
	waitOpen(t, l, 1)
	dial()
	a3 := <-accepted
	waitOpen(t, l, 2)
	fourth := dial()
	fourth.SetReadDeadline(time.Now().Add(10 * time.Second))
	if b, _ := io.ReadAll(fourth); string(b) != "busy\n" {
		t.Fatalf("still at the cap: got %q", b)
	}
	a2.Close()
	a3.Close()
	waitOpen(t, l, 0)
}

func waitOpen(t *testing.T, l *Listener, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for l.Open() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections open, want %d", l.Open(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestListenerHidesTransientErrors: the caller of Accept sees neither
// EMFILE nor the pause after it, and Close ends a pause at once.
func TestListenerHidesTransientErrors(t *testing.T) {
	shortEpisodes(t)
	logs := &syncBuffer{}
	script := &scriptedListener{script: []error{acceptErr(syscall.EMFILE), acceptErr(syscall.ENOBUFS), nil}, err: net.ErrClosed}
	l := NewListener(script, 0, nil, slog.New(slog.NewTextHandler(logs, nil)))
	c, err := l.Accept()
	if err != nil {
		t.Fatalf("Accept: %v", err)
	}
	c.Close()
	if !strings.Contains(logs.String(), "accept failing") {
		t.Fatalf("episode not logged:\n%s", logs.String())
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("a fatal error must reach the caller, got %v", err)
	}

	// A pause of up to a second ends with Close.
	slow := &scriptedListener{script: []error{acceptErr(syscall.EMFILE), acceptErr(syscall.EMFILE), acceptErr(syscall.EMFILE),
		acceptErr(syscall.EMFILE), acceptErr(syscall.EMFILE), acceptErr(syscall.EMFILE), acceptErr(syscall.EMFILE),
		acceptErr(syscall.EMFILE), acceptErr(syscall.EMFILE), acceptErr(syscall.EMFILE)}, hold: make(chan struct{}), err: net.ErrClosed}
	ls := NewListener(&closeReleases{slow}, 0, nil, slog.New(slog.NewTextHandler(logs, nil)))
	done := make(chan error, 1)
	go func() { _, err := ls.Accept(); done <- err }()
	time.Sleep(1400 * time.Millisecond) // into the 1 s pause (1.275 s to 2.275 s)
	start := time.Now()
	ls.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Fatalf("Accept returned %v after Close", d)
	}
}

// closeReleases makes Close of a scripted listener end its hold.
type closeReleases struct{ *scriptedListener }

func (c *closeReleases) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.script = nil
	select {
	case <-c.hold:
	default:
		close(c.hold)
	}
	return nil
}
