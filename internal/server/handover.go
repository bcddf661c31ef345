package server

import (
	"context"
	"net"
	"os"
	"sync"
	"time"

	"packwire/internal/handover"
)

// takeInherited removes from inherited and returns the listener for the
// transport name at addr: the one of that name, or else an unnamed one
// (systemd's "fdN") on addr's port; nil if there is none.
func takeInherited(inherited map[string]net.Listener, name, addr string) net.Listener {
	if l, ok := inherited[name]; ok {
		delete(inherited, name)
		return l
	}
	// Any other name (a socket unit's own) is matched by port, as "fdN".
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil
	}
	for k, l := range inherited {
		if k == "git" || k == "http" || k == "ssh" || k == "metrics" {
			continue
		}
		if _, p, err := net.SplitHostPort(l.Addr().String()); err == nil && p == port {
			delete(inherited, k)
			return l
		}
	}
	return nil
}

// ListenerFiles duplicates the sockets the transports accept on, with
// their names, for a next process to inherit (handover.Exec).
func (s *Server) ListenerFiles() (names []string, files []*os.File, err error) {
	for _, name := range []string{"git", "http", "ssh", "metrics"} {
		l, ok := s.listeners[name]
		if !ok {
			continue
		}
		f, err := handover.File(l)
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			return nil, nil, err
		}
		names, files = append(names, name), append(files, f)
	}
	return names, files, nil
}

// httpIdleDrain is how long a hand over leaves a kept-alive HTTP
// connection idle before it closes it: a client between two requests of
// one operation (git push's GET, then its POST once the pack is made)
// sends its next request on it and is answered with "Connection: close".
const httpIdleDrain = 10 * time.Second

// HandOver ends this server once a next process accepts on the same
// sockets: it stops accepting, serves to the end every connection it
// has accepted (a request that arrives on one is served, not refused as
// shutting down; over HTTP with "Connection: close"), closing kept-alive
// HTTP ones left idle for httpIdleDrain, then shuts down.
// When ctx ends first, what still runs is killed as by Shutdown.
func (s *Server) HandOver(ctx context.Context) error {
	if s.stopMaintain != nil {
		s.stopMaintain() // the next process's scheduler takes over
	}
	var wg sync.WaitGroup
	do := func(f func()) {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	if s.daemon != nil {
		do(func() { s.daemon.StopAccepting(); s.daemon.Wait() })
	}
	if s.ssh != nil {
		do(func() { s.ssh.StopAccepting(); s.ssh.WaitConnections() })
	}
	if s.http != nil {
		do(func() {
			// Not Shutdown at once: it would close kept-alive
			// connections under a request on its way (httpdrain).
			s.httpDrain.Drain(ctx, []net.Listener{s.httpServing}, httpIdleDrain)
			s.http.Shutdown(ctx)
		})
	}
	if s.metrics != nil {
		do(func() { s.metrics.Shutdown(ctx) })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	return s.Shutdown(ctx)
}
