package accept

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// scriptedListener returns the scripted errors (nil: a connection) in
// order, then, once hold is closed (nil: at once), err forever.
type scriptedListener struct {
	mu     sync.Mutex
	script []error
	hold   chan struct{}
	err    error
}

func (l *scriptedListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	if len(l.script) == 0 {
		l.mu.Unlock()
		if l.hold != nil {
			<-l.hold
		}
		return nil, l.err
	}
	e := l.script[0]
	l.script = l.script[1:]
	l.mu.Unlock()
	if e != nil {
		return nil, e
	}
	a, b := net.Pipe()
	b.Close()
	return a, nil
}

func (l *scriptedListener) Close() error { return nil }
func (l *scriptedListener) Addr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9418}
}

// acceptErr is what net.Listener.Accept returns for an errno.
func acceptErr(errno syscall.Errno) error {
	return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", errno)}
}

// syncBuffer is a log destination the settle timer's goroutine writes too.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func shortEpisodes(t *testing.T) {
	old := episodeQuiet
	episodeQuiet = 30 * time.Millisecond
	t.Cleanup(func() { episodeQuiet = old })
}

func TestTransient(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED, syscall.EINTR, syscall.EAGAIN, syscall.EPROTO} {
		if !Transient(acceptErr(errno)) {
			t.Errorf("%v is not transient", errno)
		}
	}
	for _, err := range []error{acceptErr(syscall.EBADF), acceptErr(syscall.EINVAL), acceptErr(syscall.ENOTSOCK), net.ErrClosed, errors.New("other")} {
		if Transient(err) {
			t.Errorf("%v is transient", err)
		}
	}
}

// TestLoopRidesOutTransientErrors: EMFILE and friends are retried; an
// episode, flaps included (a connection accepted between failures), is
// logged once when it starts and once when accepts have worked for a
// while; a fatal error ends the loop with it; a listener closed on purpose
// ends it with nil.
func TestLoopRidesOutTransientErrors(t *testing.T) {
	shortEpisodes(t)
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	emfile := acceptErr(syscall.EMFILE)
	l := &scriptedListener{
		script: []error{nil, emfile, emfile, acceptErr(syscall.ENFILE), nil, emfile, nil, nil},
		hold:   make(chan struct{}),
		err:    acceptErr(syscall.EBADF),
	}
	var accepted int
	done := make(chan error, 1)
	go func() {
		done <- Loop(l, log, func() bool { return false }, func(c net.Conn) { accepted++; c.Close() })
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "accept recovered") {
		if time.Now().After(deadline) {
			t.Fatalf("recovery never logged:\n%s", logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(l.hold)
	if err := <-done; !errors.Is(err, syscall.EBADF) {
		t.Fatalf("Loop returned %v, want the fatal EBADF", err)
	}
	if accepted != 4 {
		t.Fatalf("accepted %d connections, want 4", accepted)
	}
	out := logs.String()
	if n := strings.Count(out, "accept failing"); n != 1 || !strings.Contains(out, "too many open files") {
		t.Fatalf("%d 'accept failing' lines for one flapping episode, or no error text:\n%s", n, out)
	}
	if n := strings.Count(out, "accept recovered"); n != 1 || !strings.Contains(out, "retries=4") {
		t.Fatalf("recovery not logged once with its 4 retries:\n%s", out)
	}

	closed := &scriptedListener{err: net.ErrClosed}
	if err := Loop(closed, log, func() bool { return true }, func(net.Conn) {}); err != nil {
		t.Fatalf("closed on purpose: %v", err)
	}
	if err := Loop(closed, log, func() bool { return false }, func(net.Conn) {}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("closed by someone else: %v", err)
	}
}

// TestEpisodesApart: failures apart by more than the quiet period are two
// episodes, each logged.
func TestEpisodesApart(t *testing.T) {
	shortEpisodes(t)
	logs := &syncBuffer{}
	b := &backoff{log: slog.New(slog.NewTextHandler(logs, nil)), addr: &net.TCPAddr{}}
	for i := 1; i <= 2; i++ {
		b.failed(acceptErr(syscall.EMFILE))
		b.succeeded()
		deadline := time.Now().Add(10 * time.Second)
		for strings.Count(logs.String(), "accept recovered") < i && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
	b.stop()
	if f, r := strings.Count(logs.String(), "accept failing"), strings.Count(logs.String(), "accept recovered"); f != 2 || r != 2 {
		t.Fatalf("%d failing and %d recovered lines, want 2 of each:\n%s", f, r, logs.String())
	}
}

func TestBackoffDoublesToOneSecond(t *testing.T) {
	b := &backoff{log: slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)), addr: &net.TCPAddr{}}
	defer b.stop()
	var got []string
	for range 10 {
		got = append(got, b.failed(acceptErr(syscall.EMFILE)).String())
	}
	want := "[5ms 10ms 20ms 40ms 80ms 160ms 320ms 640ms 1s 1s]"
	if fmt.Sprint(got) != want {
		t.Fatalf("delays %v, want %s", got, want)
	}
	b.succeeded()
	if d := b.failed(acceptErr(syscall.EMFILE)); d != firstDelay {
		t.Fatalf("after a success the pause starts over at %v, got %v", firstDelay, d)
	}
}
