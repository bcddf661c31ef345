// Package netem is a userspace TCP proxy that makes a fast link look like a
// slow or distant one, without root and without tc: it delays each
// direction, limits bandwidth, resets connections on purpose, and counts for
// every connection the bytes each way and the round trips the two sides
// waited for each other.
//
// # Delay
//
// Delay is the round-trip time the proxy adds: each direction waits
// Delay/2. A proxy with Delay 100ms between a client and a server on
// loopback behaves like a server 100 ms away (ping would say 100 ms). The
// TCP handshake costs a round trip too: the client's connect returns at
// once (the kernel answers it), so the proxy holds the client's first bytes
// until Delay after the accept, and dials the server only at 1.5 x Delay
// after the accept, when the server would have seen the handshake's last
// packet. A server that speaks first is thus heard 2 x Delay after the
// connect, and a client that speaks first gets its first answer 2 x Delay
// after it, plus the server's time, as over a real link.
//
// Jitter varies each chunk's one-way delay uniformly within ±Jitter/2
// (so a round trip varies by up to ±Jitter). Chunks are never reordered: a
// chunk is never delivered before the one read before it, as TCP would
// deliver them.
//
// Data keeps streaming while delayed: each direction has a reader that
// stamps every chunk it reads with its delivery time and queues it, and a
// writer that delivers chunks when they are due, so a full bandwidth-delay
// product is in flight (up to 8 MiB per direction; more holds the sender
// back, as a TCP window would).
//
// Rate is a token bucket per direction of each connection, refilled at Rate
// bytes per second, holding one read's worth (a read is at most 10 ms of
// data at that rate): the reader waits for its tokens before it reads more,
// so the sender is slowed through TCP backpressure, not by dropping data.
//
// What a userspace proxy cannot delay: TCP's own packets. The kernel
// answers the handshake and acknowledges data at loopback speed, so
// whatever hinges on ACK timing (Nagle's algorithm holding a sender's small
// writes until the previous one is acknowledged, slow start, window
// growth) behaves as on loopback, not as on the simulated link. Over a real
// link Nagle can cost a sender of several small writes one more round trip
// than it does here.
//
// ResetAfter resets a connection (an RST to both sides, SO_LINGER 0) once
// that many bytes have been delivered, both directions together; the chunk
// that crosses the limit is cut at it.
//
// # Round trips
//
// A connection's round trips are its connect plus its turns. A turn is
// counted each time the server sends data after client data was delivered
// to it since the server's previous data (or, for the first server data,
// since the connection opened). That is each time the client had to wait
// for the server's answer to what it sent: a client and a server doing k
// request/response exchanges make k turns (k+1 round trips with the
// connect); a server greeting first adds one, as it costs one. Server data
// that follows server data (a long answer in many writes, progress, a
// pack) is part of the same turn, and so is data a client sends without
// waiting for anything (a final flush before it hangs up). When both sides
// send at the same time (git's protocol v0 negotiation streaming haves
// while acknowledgements come back), turns overcount what the client
// really waited for; the wall time fitted over several delays (see package
// rtt) is then the better measure.
package netem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"packwire/internal/transport/accept"
)

const (
	chunkSize   = 32 << 10
	queueChunks = 256 // 8 MiB of 32 KiB chunks in flight per direction
)

// Proxy forwards every connection it accepts on Listen to Upstream. Set
// the fields, then call Start. The zero values of the knobs mean no delay,
// no jitter, no rate limit and no reset.
type Proxy struct {
	Listen     string        // address to listen on; "" is 127.0.0.1:0
	Upstream   string        // host:port every connection is forwarded to
	Delay      time.Duration // round-trip time added: each direction waits Delay/2
	Jitter     time.Duration // each chunk's one-way delay varies uniformly within ±Jitter/2
	Rate       int64         // bytes per second in each direction of each connection; 0: unlimited
	ResetAfter int64         // reset a connection once this many bytes passed, both ways together; 0: never
	Seed       uint64        // seed of the jitter; the same seed gives the same delays

	// DialTimeout bounds the dial to Upstream (default 10s).
	DialTimeout time.Duration
	// OnClose, if set, is called with each connection's final statistics.
	OnClose func(ConnStats)

	mu     sync.Mutex
	ln     net.Listener
	conns  []*proxyConn
	closed bool
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// ConnStats is what the proxy saw of one connection.
type ConnStats struct {
	ID        int       `json:"id"` // 1, 2, ... in accept order
	Client    string    `json:"client"`
	Opened    time.Time `json:"opened"`
	Closed    time.Time `json:"closed,omitzero"` // zero while the connection is open
	BytesUp   int64     `json:"bytes_up"`        // client to server, delivered
	BytesDown int64     `json:"bytes_down"`      // server to client, delivered
	Turns     int       `json:"turns"`           // server answers after client data (see the package doc)
	Reset     bool      `json:"reset,omitempty"` // the proxy reset it (ResetAfter)
	Err       string    `json:"error,omitempty"` // why it ended abnormally, if it did
}

// RoundTrips is the connect plus the turns.
func (c ConnStats) RoundTrips() int { return 1 + c.Turns }

// Usage is what a set of connections cost between two snapshots.
type Usage struct {
	Conns      int   `json:"conns"`       // connections opened in between
	Turns      int   `json:"turns"`       // turns in between, on new and old connections
	RoundTrips int   `json:"round_trips"` // Conns + Turns
	BytesUp    int64 `json:"bytes_up"`
	BytesDown  int64 `json:"bytes_down"`
	Resets     int   `json:"resets"`
}

// Delta is what happened between two snapshots of Conns: connections that
// are new in after count with their connect, connections already in before
// (an SSH master kept open) only with their new turns and bytes.
func Delta(before, after []ConnStats) Usage {
	old := make(map[int]ConnStats, len(before))
	for _, c := range before {
		old[c.ID] = c
	}
	var u Usage
	for _, c := range after {
		b, seen := old[c.ID]
		if !seen {
			u.Conns++
		}
		u.Turns += c.Turns - b.Turns
		u.BytesUp += c.BytesUp - b.BytesUp
		u.BytesDown += c.BytesDown - b.BytesDown
		if c.Reset && !b.Reset {
			u.Resets++
		}
	}
	u.RoundTrips = u.Conns + u.Turns
	return u
}

// ErrClosed is returned by Start on a proxy already closed.
var ErrClosed = errors.New("netem: proxy closed")

// Start listens and forwards connections in the background until ctx ends
// or Close is called. It returns the address clients should connect to.
func (p *Proxy) Start(ctx context.Context) (string, error) {
	if p.Upstream == "" {
		return "", errors.New("netem: no upstream address")
	}
	if p.Delay < 0 || p.Jitter < 0 || p.Rate < 0 || p.ResetAfter < 0 {
		return "", errors.New("netem: delay, jitter, rate and reset-after must not be negative")
	}
	if p.Jitter > p.Delay {
		return "", fmt.Errorf("netem: jitter %v is larger than the delay %v (a delay cannot be negative)", p.Jitter, p.Delay)
	}
	listen := p.Listen
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return "", ErrClosed
	}
	if p.ln != nil {
		return "", errors.New("netem: proxy already started")
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return "", fmt.Errorf("netem: listen on %s: %w", listen, err)
	}
	ctx, p.cancel = context.WithCancel(ctx)
	p.ln = ln
	p.wg.Add(2)
	go func() {
		defer p.wg.Done()
		<-ctx.Done()
		ln.Close()
	}()
	go func() {
		defer p.wg.Done()
		p.acceptLoop(ctx, ln)
	}()
	return ln.Addr().String(), nil
}

// Conns returns the statistics of every connection so far, open ones
// included, in accept order.
func (p *Proxy) Conns() []ConnStats {
	p.mu.Lock()
	conns := append([]*proxyConn(nil), p.conns...)
	p.mu.Unlock()
	out := make([]ConnStats, len(conns))
	for i, c := range conns {
		out[i] = c.snapshot()
	}
	return out
}

// Close stops listening, ends every connection and waits for them.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	cancel := p.cancel
	p.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	p.wg.Wait()
	return nil
}

func (p *Proxy) acceptLoop(ctx context.Context, ln net.Listener) {
	for {
		client, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // out of file descriptors: do not spin
			continue
		}
		// Both of the proxy's sockets acknowledge at once, as packwire's
		// do: a delayed ACK would hold up each small write of a client or
		// server with Nagle on (git) by 40 ms, and the lab would measure
		// its own proxy (every v2 command through a zero-delay proxy cost
		// 40 ms more than without it).
		client = accept.QuickAck(client)
		p.mu.Lock()
		c := &proxyConn{proxy: p, client: client, id: len(p.conns) + 1, opened: time.Now(), abort: make(chan struct{})}
		c.clientDelivered.Store(true) // a server that speaks first answers the connect
		p.conns = append(p.conns, c)
		p.wg.Add(1)
		p.mu.Unlock()
		go func() {
			defer p.wg.Done()
			c.run(ctx)
		}()
	}
}

// proxyConn is one proxied connection.
type proxyConn struct {
	proxy    *Proxy
	client   net.Conn
	upstream net.Conn
	id       int
	opened   time.Time

	bytesUp, bytesDown atomic.Int64
	delivered          atomic.Int64 // both directions, for ResetAfter
	turns              atomic.Int64
	// clientDelivered is set when client data is handed to the server and
	// cleared by the next server data, which then counts as a turn.
	clientDelivered atomic.Bool

	mu     sync.Mutex
	closed time.Time
	reset  bool
	err    string

	abort     chan struct{}
	abortOnce sync.Once
}

func (c *proxyConn) snapshot() ConnStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return ConnStats{
		ID: c.id, Client: c.client.RemoteAddr().String(), Opened: c.opened, Closed: c.closed,
		BytesUp: c.bytesUp.Load(), BytesDown: c.bytesDown.Load(), Turns: int(c.turns.Load()),
		Reset: c.reset, Err: c.err,
	}
}

func (c *proxyConn) fail(msg string) {
	c.mu.Lock()
	if c.err == "" {
		c.err = msg
	}
	c.mu.Unlock()
}

// stop ends both directions at once and closes both connections; rst
// sends RSTs instead of FINs.
func (c *proxyConn) stop(rst bool) {
	c.abortOnce.Do(func() {
		close(c.abort)
		c.mu.Lock()
		upstream := c.upstream
		c.mu.Unlock()
		for _, conn := range []net.Conn{c.client, upstream} {
			if conn == nil {
				continue
			}
			if rst {
				resetConn(conn)
			} else {
				conn.Close()
			}
		}
	})
}

func resetConn(conn net.Conn) {
	if tc, ok := conn.(interface{ SetLinger(int) error }); ok {
		tc.SetLinger(0) // close sends RST, discarding unsent data
	}
	conn.Close()
}

func (c *proxyConn) run(ctx context.Context) {
	p := c.proxy
	var readers sync.WaitGroup
	defer func() {
		c.stop(false) // a no-op unless the connection ended normally
		readers.Wait()
		c.mu.Lock()
		c.closed = time.Now()
		c.mu.Unlock()
		if p.OnClose != nil {
			p.OnClose(c.snapshot())
		}
	}()
	go func() {
		select {
		case <-ctx.Done():
			c.stop(false)
		case <-c.abort:
		}
	}()

	oneWay := p.Delay / 2
	// The handshake: the client may send at once, but its bytes leave only
	// once its connect would have completed.
	up := newDirection(p, c, uint64(c.id)*2, c.opened.Add(p.Delay))
	down := newDirection(p, c, uint64(c.id)*2+1, time.Time{})
	readers.Add(1)
	go func() {
		defer readers.Done()
		up.read(c.client, nil)
	}()

	// The server sees the connection when the handshake's last packet
	// reaches it.
	if !sleepUntil(c.opened.Add(p.Delay+oneWay), c.abort) {
		return
	}
	timeout := p.DialTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	upstream, err := net.DialTimeout("tcp", p.Upstream, timeout)
	if err != nil {
		c.fail(fmt.Sprintf("dial upstream %s: %v", p.Upstream, err))
		c.stop(true)
		return
	}
	upstream = accept.QuickAck(upstream)
	c.mu.Lock()
	c.upstream = upstream
	c.mu.Unlock()
	select {
	case <-c.abort: // stopped while dialling, before it could see upstream
		resetConn(upstream)
		return
	default:
	}

	readers.Add(1)
	go func() {
		defer readers.Done()
		down.read(upstream, func() {
			if c.clientDelivered.Swap(false) {
				c.turns.Add(1)
			}
		})
	}()
	var writers sync.WaitGroup
	writers.Add(2)
	go func() {
		defer writers.Done()
		up.write(upstream, &c.bytesUp, func() { c.clientDelivered.Store(true) })
	}()
	go func() {
		defer writers.Done()
		down.write(c.client, &c.bytesDown, nil)
	}()
	writers.Wait()
}

// chunk is data read from one side, due at the other at a time.
type chunk struct {
	data []byte
	due  time.Time
	end  bool // the sender closed (EOF) or failed; data is empty
	rst  bool // with end: the sender's side was reset or failed, reset the receiver too
}

var chunkPool = sync.Pool{New: func() any { b := make([]byte, chunkSize); return &b }}

// direction is one way of a connection: a reader that stamps and queues
// chunks, a writer that delivers them when due.
type direction struct {
	proxy    *Proxy
	conn     *proxyConn
	queue    chan chunk
	notEarly time.Time // nothing leaves before this (the handshake)
	rng      *rand.Rand
	lastDue  time.Time
	linkFree time.Time // when the token bucket has tokens again
	readSize int
}

func newDirection(p *Proxy, c *proxyConn, stream uint64, notEarly time.Time) *direction {
	d := &direction{proxy: p, conn: c, queue: make(chan chunk, queueChunks), notEarly: notEarly,
		rng: rand.New(rand.NewPCG(p.Seed, stream)), readSize: chunkSize}
	if p.Rate > 0 {
		// At most 10 ms of data per read, so the bucket's burst stays small.
		d.readSize = int(min(max(p.Rate/100, 512), chunkSize))
	}
	return d
}

// oneWay is this chunk's one-way delay, with jitter.
func (d *direction) oneWay() time.Duration {
	base := d.proxy.Delay / 2
	if j := d.proxy.Jitter; j > 0 {
		base += time.Duration(d.rng.Int64N(int64(j)+1)) - j/2
	}
	return max(base, 0)
}

// read queues what src sends until it closes or fails. onData runs as
// each read returns, before the chunk is queued.
func (d *direction) read(src net.Conn, onData func()) {
	defer close(d.queue)
	for {
		bp := chunkPool.Get().(*[]byte)
		buf := (*bp)[:d.readSize]
		n, err := src.Read(buf)
		now := time.Now()
		if n > 0 {
			if onData != nil {
				onData()
			}
			leaves := now
			if d.proxy.Rate > 0 {
				// Token bucket: n bytes take n/Rate of the link, starting when
				// it is free. Waiting here holds the sender back.
				start := now
				if d.linkFree.After(start) {
					start = d.linkFree
				}
				d.linkFree = start.Add(time.Duration(float64(n) / float64(d.proxy.Rate) * float64(time.Second)))
				if !sleepUntil(d.linkFree, d.conn.abort) {
					chunkPool.Put(bp)
					return
				}
				leaves = d.linkFree
			}
			if !d.push(chunk{data: buf[:n]}, leaves) {
				chunkPool.Put(bp)
				return
			}
		} else {
			chunkPool.Put(bp)
		}
		if err != nil {
			rst := !errors.Is(err, io.EOF)
			select {
			case <-d.conn.abort:
				return
			default:
			}
			d.push(chunk{end: true, rst: rst}, now)
			return
		}
	}
}

// push stamps c with its due time, never before the previous chunk's, and
// queues it; false if the connection was aborted.
func (d *direction) push(c chunk, leaves time.Time) bool {
	if leaves.Before(d.notEarly) {
		leaves = d.notEarly
	}
	c.due = leaves.Add(d.oneWay())
	if c.due.Before(d.lastDue) {
		c.due = d.lastDue
	}
	d.lastDue = c.due
	select {
	case d.queue <- c:
		return true
	case <-d.conn.abort:
		return false
	}
}

// write delivers queued chunks to dst when due; onDeliver runs before
// each chunk is written.
func (d *direction) write(dst net.Conn, counter *atomic.Int64, onDeliver func()) {
	p := d.proxy
	for c := range d.queue {
		if !sleepUntil(c.due, d.conn.abort) {
			return
		}
		if c.end {
			if c.rst {
				d.conn.fail("the other side reset the connection or failed")
				d.conn.stop(true)
				return
			}
			if cw, ok := dst.(interface{ CloseWrite() error }); ok {
				cw.CloseWrite()
			}
			return
		}
		data := c.data
		cut := false
		if p.ResetAfter > 0 {
			total := d.conn.delivered.Add(int64(len(data)))
			if total >= p.ResetAfter {
				over := total - p.ResetAfter
				data = data[:max(int64(len(data))-over, 0)]
				cut = true
			}
		}
		if onDeliver != nil && len(data) > 0 {
			onDeliver()
		}
		n, err := dst.Write(data)
		counter.Add(int64(n))
		bp := c.data[:cap(c.data)]
		chunkPool.Put(&bp)
		if cut {
			d.conn.mu.Lock()
			d.conn.reset = true
			d.conn.mu.Unlock()
			d.conn.stop(true)
			return
		}
		if err != nil {
			d.conn.fail(fmt.Sprintf("write: %v", err))
			d.conn.stop(true)
			return
		}
	}
}

// sleepUntil waits until t; false if abort closed first.
func sleepUntil(t time.Time, abort <-chan struct{}) bool {
	d := time.Until(t)
	if d <= 0 {
		select {
		case <-abort:
			return false
		default:
			return true
		}
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-abort:
		return false
	}
}
