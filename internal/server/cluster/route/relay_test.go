package route

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"packwire/internal/gitexec"
	"packwire/internal/pipeline"
	"packwire/internal/server/cluster"
)

// TestRelayEndsWhenTheNodeFailsBeforeAnswering: a serving node that reads
// the relay's headers and then dies (its connection reset, as after a
// crash or when its PostgreSQL restarted) must fail the relay at once with
// "unreachable", not leave it waiting for ever: Go's Transport waits for
// the request body's writer, and the body is a pipe fed only later.
func TestRelayEndsWhenTheNodeFailsBeforeAnswering(t *testing.T) {
	url := fakeNode(t, func(c net.Conn) {
		http.ReadRequest(bufio.NewReader(c)) // the headers, then nothing
		time.Sleep(50 * time.Millisecond)
		c.Close()
	})
	rt := &Router{Secret: "s"}
	req := pipeline.Request{Transport: "http", Service: gitexec.ReceivePack}
	done := make(chan error, 1)
	go func() {
		_, err := rt.relayTo(context.Background(), cluster.Replica{Node: "b", URL: url}, req, "app", cluster.Placement{})
		done <- err
	}()
	select {
	case err := <-done:
		var perr *pipeline.Error
		if !errors.As(err, &perr) || perr.Code != pipeline.CodeUnavailable {
			t.Fatalf("relay to a node that died: %v, want unavailable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the relay still waits 10 s after the serving node closed its connection")
	}
}

// TestRelayCutMidAnswerIsUnavailable: a serving node that accepted the
// relay and then died before its answer ended (killed while git ran)
// fails the relay as unavailable, which the client's transport words as
// such (HTTP 503), not as a bad request.
func TestRelayCutMidAnswerIsUnavailable(t *testing.T) {
	url := fakeNode(t, func(c net.Conn) {
		http.ReadRequest(bufio.NewReader(c))
		c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n"))
		time.Sleep(50 * time.Millisecond)
		c.Close()
	})
	rt := &Router{Secret: "s"}
	req := pipeline.Request{Transport: "http", Service: gitexec.ReceivePack}
	relay, err := rt.relayTo(context.Background(), cluster.Replica{Node: "b", URL: url}, req, "app", cluster.Placement{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = relay.Relay(context.Background(), req, "app", strings.NewReader(""), io.Discard, nil)
	var perr *pipeline.Error
	if !errors.As(err, &perr) || perr.Code != pipeline.CodeUnavailable {
		t.Fatalf("a relay cut mid-answer: %v, want unavailable", err)
	}
}

// TestRelayEndsWhenTheClientLeaves: the client's context ending while the
// serving node has not answered ends the relay.
func TestRelayEndsWhenTheClientLeaves(t *testing.T) {
	url := fakeNode(t, func(c net.Conn) {}) // accepted, never answered
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	rt := &Router{Secret: "s"}
	done := make(chan error, 1)
	go func() {
		_, err := rt.relayTo(ctx, cluster.Replica{Node: "b", URL: url}, pipeline.Request{Transport: "http", Service: gitexec.UploadPack}, "app", cluster.Placement{})
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a relay whose client left succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the relay still waits 10 s after its client left")
	}
}

// fakeNode listens on loopback and hands each connection to serve; the
// listener and its connections close with the test.
func fakeNode(t *testing.T, serve func(net.Conn)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conns := make(chan net.Conn, 16)
	t.Cleanup(func() {
		ln.Close()
		for {
			select {
			case c := <-conns:
				c.Close()
			default:
				return
			}
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			select {
			case conns <- c:
			default:
			}
			go serve(c)
		}
	}()
	return "http://" + ln.Addr().String()
}
