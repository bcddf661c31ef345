package accept

import (
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Penalties refuse, right after accept and without reading a byte, the
// connections of an address (an IPv6 /64) that keeps misbehaving: OpenSSH's
// PerSourcePenalties. Each offence (a malformed request, a connection
// refused over a per-address bound, a request that never came) adds its
// cost to the address's penalty, which runs down with time; once it
// exceeds Min the address is refused at accept until it has run out. An
// address penalized again soon after a penalty ended gets twice the last
// one. No penalty is longer than Max.
//
// Without them a flood of connections that are each refused costs the
// server a goroutine, a read, a log line and often a key exchange apiece,
// as fast as the attacker reconnects; with them it costs an accept and a
// close. A nil *Penalties penalizes nothing.
type Penalties struct {
	min, max time.Duration
	exempt   func(netip.Addr) bool
	log      *slog.Logger
	now      func() time.Time // tests

	held held // refused connections waiting for their reset

	mu sync.Mutex
	by map[netip.Addr]*penalty
	// swept is when by was last cleared of penalties long over.
	swept time.Time
}

// penalty is one address's account.
type penalty struct {
	until   time.Time     // the penalty runs out then
	blocked bool          // it passed min: connections are refused at accept
	last    time.Duration // the length of its last block, doubled on a relapse
	ended   time.Time     // when that block ran out
	refused int           // connections refused at accept during this block
	reason  string        // the offence that started the block
}

// maxSources bounds the addresses with a penalty account, as OpenSSH's
// max-sources4/max-sources6: past it a new offender is not tracked (not
// refused), so that a flood from many addresses cannot grow the map
// without bound.
const maxSources = 65536

// sourceOf is the account an address is charged to: itself for IPv4, its
// /64 for IPv6, where one host commonly has a whole /64 to pick from.
func sourceOf(remote net.Addr) (netip.Addr, bool) {
	addr, ok := addrOf(remote)
	if !ok || addr.Is4() {
		return addr, ok
	}
	prefix, err := addr.Prefix(64)
	return prefix.Addr(), err == nil
}

// Offence costs, as OpenSSH's (noauth:1s authfail:5s grace-exceeded:10s).
const (
	// CostProtocol is a malformed request or packet, or a failed SSH
	// handshake.
	CostProtocol = 2 * time.Second
	// CostBusy is a connection refused over a per-address bound.
	CostBusy = time.Second
	// CostTimeout is a connection that sent no request in --init-timeout.
	CostTimeout = 10 * time.Second
)

// NewPenalties starts penalizing addresses once their penalty exceeds min,
// for at most max; max <= 0 returns nil (off). exempt (nil: none) names
// addresses never penalized: trusted reverse proxies, behind which every
// client shares one address. log (nil: slog.Default) gets one line when an
// address starts being refused and one when it is let in again.
func NewPenalties(min, max time.Duration, exempt func(netip.Addr) bool, log *slog.Logger) *Penalties {
	if max <= 0 {
		return nil
	}
	if log == nil {
		log = slog.Default()
	}
	return &Penalties{min: min, max: max, exempt: exempt, log: log, now: time.Now, by: make(map[netip.Addr]*penalty)}
}

// Offend adds cost to remote's penalty for reason (for the log).
func (p *Penalties) Offend(remote net.Addr, cost time.Duration, reason string) {
	if p == nil {
		return
	}
	if a, ok := addrOf(remote); !ok || (p.exempt != nil && p.exempt(a)) {
		return
	}
	addr, _ := sourceOf(remote)
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	p.sweepLocked(now)
	a := p.by[addr]
	if a == nil {
		if len(p.by) >= maxSources {
			return
		}
		a = &penalty{}
		p.by[addr] = a
	}
	p.expireLocked(addr, a, now)
	if a.blocked {
		return // already refused; an offence in flight adds nothing
	}
	a.until = later(a.until, now).Add(cost)
	if a.until.Sub(now) <= p.min {
		return
	}
	block := a.until.Sub(now)
	if !a.ended.IsZero() && now.Sub(a.ended) < p.max {
		block = max(block, 2*a.last) // a relapse: twice the last
	}
	block = min(block, p.max)
	a.blocked, a.until, a.last, a.refused, a.reason = true, now.Add(block), block, 0, reason
	p.log.Warn("refusing an address's connections at accept", "remote", addr.String(), "for", block.String(), "reason", reason)
}

// Refused reports whether remote is being refused: the caller closes the
// connection at once (Reject).
func (p *Penalties) Refused(remote net.Addr) bool {
	if p == nil {
		return false
	}
	addr, ok := sourceOf(remote)
	if !ok {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	a := p.by[addr]
	if a == nil {
		return false
	}
	p.expireLocked(addr, a, p.now())
	if !a.blocked {
		return false
	}
	a.refused++
	return true
}

// expireLocked ends a's block or penalty once it has run out.
func (p *Penalties) expireLocked(addr netip.Addr, a *penalty, now time.Time) {
	if now.Before(a.until) {
		return
	}
	if a.blocked {
		a.blocked, a.ended = false, a.until
		p.log.Info("accepting an address's connections again", "remote", addr.String(), "refused", a.refused, "after", a.last.String(), "reason", a.reason)
	}
}

// sweepLocked forgets, once a minute at most, the addresses whose
// penalty is over and whose relapse window has passed, so that the map
// holds only recent offenders.
func (p *Penalties) sweepLocked(now time.Time) {
	if now.Sub(p.swept) < time.Minute {
		return
	}
	p.swept = now
	for addr, a := range p.by {
		if p.expireLocked(addr, a, now); !a.blocked && now.Sub(later(a.until, a.ended)) > p.max {
			delete(p.by, addr)
		}
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Reject closes c with a reset, reading nothing and writing nothing: the
// cheapest refusal there is, and it leaves no TIME_WAIT socket behind on
// the server.
func Reject(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// Refusing a penalized connection costs the server about as much as
// accepting it, and an attacker that reconnects as soon as it is reset
// comes back at once: measured, resets at once made a 300-slot reconnect
// loop open 4x the connections, which ate the 4x saving per connection.
// So a penalized connection is held unread for holdFor before its reset,
// at most maxHeld of them at once (past that they are reset at once): a
// reconnect loop then turns once a second per slot, for a descriptor
// apiece and no goroutine.
var (
	holdFor = time.Second
	maxHeld = 512
)

// held are the penalized connections waiting for their reset, oldest first.
type held struct {
	mu    sync.Mutex
	conns []heldConn
	timer *time.Timer
}

type heldConn struct {
	c     net.Conn
	until time.Time
}

// Reject resets c once it has been held for holdFor (see holdFor).
func (p *Penalties) Reject(c net.Conn) {
	if p == nil {
		Reject(c)
		return
	}
	h := &p.held
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.conns) >= maxHeld {
		Reject(c)
		return
	}
	h.conns = append(h.conns, heldConn{c, time.Now().Add(holdFor)})
	if h.timer == nil {
		h.timer = time.AfterFunc(holdFor, h.release)
	}
}

// release resets the connections held long enough, and waits for the next.
func (h *held) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	n := 0
	for n < len(h.conns) && !h.conns[n].until.After(now) {
		Reject(h.conns[n].c)
		n++
	}
	h.conns = append(h.conns[:0], h.conns[n:]...)
	h.timer = nil
	if len(h.conns) > 0 {
		h.timer = time.AfterFunc(h.conns[0].until.Sub(now), h.release)
	}
}

// Close resets every held connection at once (the server is stopping).
func (p *Penalties) Close() {
	if p == nil {
		return
	}
	h := &p.held
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, hc := range h.conns {
		Reject(hc.c)
	}
	h.conns = nil
	if h.timer != nil {
		h.timer.Stop()
		h.timer = nil
	}
}
