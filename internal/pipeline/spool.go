package pipeline

import (
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"packwire/internal/units"
)

// Spool bounds the request bodies kept on disk at once (an HTTP fetch
// request over MaxCachedBody is read whole into TempDir before it runs):
// in all, and per client address, so that clients who keep large bodies
// arriving cannot fill the disk. A body that would pass a bound is
// refused as "server busy" (HTTP 503, Retry-After) and its file removed.
// The zero Spool bounds nothing.
type Spool struct {
	Max        int64 // bytes of all bodies (0: no bound)
	MaxPerAddr int64 // bytes of one address's bodies (0: no bound)

	mu     sync.Mutex
	total  int64
	byAddr map[string]int64
}

// SetBounds changes Max and MaxPerAddr while requests run (a
// configuration reload): the bodies on disk stay, and the next body is
// held to the new bounds.
func (s *Spool) SetBounds(max, maxPerAddr int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Max, s.MaxPerAddr = max, maxPerAddr
}

// spoolRetry is the Retry-After of a body refused for a Spool bound:
// bodies are paced, so room comes back within minutes at most.
const spoolRetry = 10 * time.Second

// reserve takes n more bytes for addr, or refuses them.
func (s *Spool) reserve(addr string, n int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.Max > 0 && s.total+n > s.Max:
		return &Error{Code: CodeUnavailable, RetryAfter: spoolRetry, Err: errSpoolFull,
			Message: fmt.Sprintf("server busy: request bodies on disk at their bound (%s), retry later", units.Bytes(s.Max))}
	case s.MaxPerAddr > 0 && s.byAddr[addr]+n > s.MaxPerAddr:
		return &Error{Code: CodeUnavailable, RetryAfter: spoolRetry, Err: errSpoolFull,
			Message: fmt.Sprintf("server busy: request bodies on disk from %s at their bound (%s), retry later", addr, units.Bytes(s.MaxPerAddr))}
	}
	if s.byAddr == nil {
		s.byAddr = map[string]int64{}
	}
	s.total += n
	s.byAddr[addr] += n
	return nil
}

func (s *Spool) release(addr string, n int64) {
	if n == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total -= n
	if s.byAddr[addr] -= n; s.byAddr[addr] <= 0 {
		delete(s.byAddr, addr)
	}
}

// Usage is the bytes on disk now, in all.
func (s *Spool) Usage() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

var errSpoolFull = fmt.Errorf("request bodies on disk at their bound")

// spoolFile is a body's file, writing only what its Spool grants.
type spoolFile struct {
	f     *os.File
	spool *Spool
	addr  string
	held  int64
}

func (w *spoolFile) Write(p []byte) (int, error) {
	if w.spool != nil {
		if err := w.spool.reserve(w.addr, int64(len(p))); err != nil {
			return 0, err
		}
		w.held += int64(len(p))
	}
	return w.f.Write(p)
}

// close removes the file and gives its room back.
func (w *spoolFile) close() {
	w.f.Close()
	os.Remove(w.f.Name())
	if w.spool != nil {
		w.spool.release(w.addr, w.held)
		w.held = 0
	}
}

// remoteHost is a client address without its port.
func remoteHost(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return remote
	}
	return host
}
