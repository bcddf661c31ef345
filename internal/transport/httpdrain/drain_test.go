package httpdrain

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// serve starts an http.Server tracked by a Tracker on 127.0.0.1:0.
func serve(t *testing.T) (*Tracker, net.Listener, string, chan error) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := New()
	wrapped := tr.Listener(l)
	srv := &http.Server{
		Handler:   tr.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok "+r.URL.Path) })),
		ConnState: tr.ConnState,
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(wrapped) }()
	t.Cleanup(func() { srv.Close() })
	return tr, wrapped, l.Addr().String(), done
}

func get(t *testing.T, c net.Conn, r *bufio.Reader, path string) *http.Response {
	t.Helper()
	c.SetDeadline(time.Now().Add(time.Minute)) // a safety net only
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	body, _ := io.ReadAll(resp.Body)
	if string(body) != "ok "+path {
		t.Fatalf("GET %s: %q", path, body)
	}
	return resp
}

// TestDrainAnswersTheNextRequestOnAnIdleConnection: a kept-alive
// connection idle when the drain begins carries its client's next request,
// answered with "Connection: close", then ends; Drain returns then.
// http.Server.Shutdown closes that connection at once, and the request
// gets no answer ("Empty reply from server").
func TestDrainAnswersTheNextRequestOnAnIdleConnection(t *testing.T) {
	tr, l, addr, served := serve(t)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if resp := get(t, c, r, "/1"); resp.Close {
		t.Fatal("the first answer closes the connection")
	}
	drained := make(chan struct{})
	go func() {
		tr.Drain(context.Background(), []net.Listener{l}, time.Minute)
		close(drained)
	}()
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Fatalf("Serve: %v, want ErrServerClosed", err)
	}
	if _, err := net.Dial("tcp", addr); err == nil {
		t.Fatal("a new connection was accepted while draining")
	}
	// resp.Close: the answer said "Connection: close" (ReadResponse
	// takes the header out).
	if resp := get(t, c, r, "/2"); !resp.Close {
		t.Fatalf("the answer while draining keeps the connection: %v", resp.Header)
	}
	if n, err := r.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("after the answer: %d %v, want EOF", n, err)
	}
	select {
	case <-drained:
	case <-time.After(time.Minute):
		t.Fatal("Drain did not return once the connection ended")
	}
}

// TestDrainClosesAConnectionLeftIdle: a kept-alive connection that
// carries nothing more is closed once idle for idleFor, and Drain returns.
func TestDrainClosesAConnectionLeftIdle(t *testing.T) {
	tr, l, addr, _ := serve(t)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	get(t, c, r, "/1")
	start := time.Now()
	const idleFor = 300 * time.Millisecond
	tr.Drain(context.Background(), []net.Listener{l}, idleFor)
	if took := time.Since(start); took < idleFor/2 {
		t.Fatalf("Drain returned after %s, before the connection was idle for %s", took, idleFor)
	}
	if n, err := r.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("the idle connection is still open: %d %v", n, err)
	}
}

// TestDrainLeavesAConnectionWithARequestUnread: a connection idle for
// idleFor whose next request already sits in its socket is not closed.
func TestDrainLeavesAConnectionWithARequestUnread(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if pending(s) {
		t.Fatal("pending with nothing sent")
	}
	io.WriteString(c, "GET / HTTP/1.1\r\n\r\n")
	deadline := time.Now().Add(time.Minute)
	for !pending(s) { // loopback: the bytes are there once Write returns; a safety loop
		if time.Now().After(deadline) {
			t.Fatal("pending never saw the request")
		}
		time.Sleep(time.Millisecond)
	}
	tr := New()
	tr.ConnState(s, http.StateIdle)
	tr.conns[s].since = time.Now().Add(-time.Hour)
	if _, left := tr.closeIdle(time.Second); left != 1 {
		t.Fatalf("the connection with a request unread was closed (%d left)", left)
	}
}
