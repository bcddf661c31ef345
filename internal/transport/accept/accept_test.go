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
)

// scriptedListener returns the scripted errors (nil: a connection) in order,
// then err forever.
type scriptedListener struct {
	mu     sync.Mutex
	script []error
	err    error
}

func (l *scriptedListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.script) == 0 {
		return nil, l.err
	}
	e := l.script[0]
	l.script = l.script[1:]
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

// TestLoopRidesOutTransientErrors: EMFILE and friends are retried, one
// warning per episode however many retries, a recovery line when a
// connection comes through; a fatal error ends the loop with it; a listener
// closed on purpose ends it with nil.
func TestLoopRidesOutTransientErrors(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	emfile, enfile := acceptErr(syscall.EMFILE), acceptErr(syscall.ENFILE)
	fatal := acceptErr(syscall.EBADF)
	l := &scriptedListener{
		script: []error{nil, emfile, emfile, enfile, emfile, nil, nil, acceptErr(syscall.ECONNABORTED), nil},
		err:    fatal,
	}
	accepted := 0
	err := Loop(l, log, func() bool { return false }, func(c net.Conn) { accepted++; c.Close() })
	if !errors.Is(err, syscall.EBADF) {
		t.Fatalf("Loop returned %v, want the fatal EBADF", err)
	}
	if accepted != 4 {
		t.Fatalf("accepted %d connections, want 4", accepted)
	}
	out := logs.String()
	if n := strings.Count(out, "accept failing"); n != 2 {
		t.Fatalf("%d 'accept failing' lines for 2 episodes:\n%s", n, out)
	}
	if n := strings.Count(out, "accept recovered"); n != 2 || !strings.Contains(out, "retries=4") {
		t.Fatalf("recoveries not logged once per episode with their retries:\n%s", out)
	}
	if !strings.Contains(out, "too many open files") {
		t.Fatalf("the error is not in the log:\n%s", out)
	}

	closed := &scriptedListener{err: net.ErrClosed}
	if err := Loop(closed, log, func() bool { return true }, func(net.Conn) {}); err != nil {
		t.Fatalf("closed on purpose: %v", err)
	}
	if err := Loop(closed, log, func() bool { return false }, func(net.Conn) {}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("closed by someone else: %v", err)
	}
}

func TestBackoffDoublesToOneSecond(t *testing.T) {
	b := backoff{log: slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)), addr: &net.TCPAddr{}}
	var got []string
	for range 10 {
		got = append(got, b.failed(acceptErr(syscall.EMFILE)).String())
	}
	want := "[5ms 10ms 20ms 40ms 80ms 160ms 320ms 640ms 1s 1s]"
	if fmt.Sprint(got) != want {
		t.Fatalf("delays %v, want %s", got, want)
	}
}
