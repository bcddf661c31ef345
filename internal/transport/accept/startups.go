package accept

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
)

// Startups bounds, per source address, the connections that have not yet
// sent a complete request (OpenSSH's PerSourceMaxStartups): a git://
// connection until its request line, SSH until its first command, HTTP
// until its first request's headers. Without it one address opening idle
// connections fills --max-connections and locks every other client out for
// --init-timeout, again and again. A connection past its request no longer
// counts: its own bounds (request pace, idle timeout, per-client limits)
// hold it from there. A nil *Startups bounds nothing.
type Startups struct {
	max    int
	exempt func(netip.Addr) bool

	mu   sync.Mutex
	open map[netip.Addr]int

	refusing refusals
}

// NewStartups bounds each address to max connections before their
// request; max <= 0 returns nil (no bound). exempt (nil: none) names
// addresses that are not bounded: trusted reverse proxies, behind which
// every client shares one address.
func NewStartups(max int, exempt func(netip.Addr) bool) *Startups {
	if max <= 0 {
		return nil
	}
	return &Startups{max: max, exempt: exempt, open: make(map[netip.Addr]int)}
}

// Max is the bound per address (0: none).
func (s *Startups) Max() int {
	if s == nil {
		return 0
	}
	return s.max
}

// Begin counts a connection from remote until done is called (done may be
// called more than once). ok is false when remote already has Max
// connections before their request: the caller refuses this one, without
// counting it against any other bound, as a refused connection holds
// nothing an honest client needs.
func (s *Startups) Begin(remote net.Addr) (done func(), ok bool) {
	nothing := func() {}
	if s == nil {
		return nothing, true
	}
	addr, known := addrOf(remote)
	if !known || (s.exempt != nil && s.exempt(addr)) {
		return nothing, true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open[addr] >= s.max {
		return nothing, false
	}
	s.open[addr]++
	var once sync.Once
	return func() { once.Do(func() { s.end(addr) }) }, true
}

func (s *Startups) end(addr netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open[addr]--; s.open[addr] <= 0 {
		delete(s.open, addr)
	}
}

// Refuse answers c with answer (see refusals) and closes it.
func (s *Startups) Refuse(c net.Conn, answer func(net.Conn)) { s.refusing.answer(c, answer) }

// refusals bounds the refusals being answered at once. answer (which tells
// the client why, within a few seconds) runs in a goroutine of its own and
// the connection is closed after it; past maxRefusing answers at once, or
// without an answer, it is closed unanswered, so that a flood of refused
// connections holds a bounded number of descriptors.
type refusals struct{ n atomic.Int64 }

func (r *refusals) answer(c net.Conn, answer func(net.Conn)) {
	if answer == nil {
		c.Close()
		return
	}
	if r.n.Add(1) > maxRefusing {
		r.n.Add(-1)
		c.Close()
		return
	}
	go func() {
		defer r.n.Add(-1)
		defer c.Close()
		answer(c)
	}()
}

// addrOf is the address a connection comes from, IPv4 in IPv6 unmapped.
func addrOf(a net.Addr) (netip.Addr, bool) {
	if tcp, ok := a.(*net.TCPAddr); ok {
		ip, ok := netip.AddrFromSlice(tcp.IP)
		return ip.Unmap(), ok
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}, false
	}
	return ap.Addr().Unmap(), true
}
