package accept

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestPenalties: offences below Min refuse nothing; past it the address is
// refused (others and exempt ones are not) until the penalty runs out; a
// relapse soon after gets twice the last block, capped at Max; long after,
// it starts from nothing again.
func TestPenalties(t *testing.T) {
	proxy := netip.MustParseAddr("10.0.0.1")
	p := NewPenalties(15*time.Second, time.Minute, func(a netip.Addr) bool { return a == proxy }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	now := time.Unix(1_000_000, 0)
	p.now = func() time.Time { return now }
	from := func(ip string) net.Addr { return &net.TCPAddr{IP: net.ParseIP(ip), Port: 4000} }
	bad, other := from("192.0.2.7"), from("192.0.2.8")

	for range 7 { // 14 s: below Min
		p.Offend(bad, CostProtocol, "test")
	}
	if p.Refused(bad) {
		t.Fatal("refused below Min")
	}
	p.Offend(from("::ffff:192.0.2.7"), CostProtocol, "test") // 16 s, the same address in IPv6
	if !p.Refused(bad) {
		t.Fatal("not refused past Min")
	}
	if p.Refused(other) {
		t.Fatal("another address refused")
	}
	for range 20 {
		p.Offend(from("10.0.0.1"), CostTimeout, "test")
	}
	if p.Refused(from("10.0.0.1")) {
		t.Fatal("an exempt address refused")
	}
	now = now.Add(15 * time.Second)
	if !p.Refused(bad) {
		t.Fatal("the 16 s block ended after 15 s")
	}
	now = now.Add(2 * time.Second)
	if p.Refused(bad) {
		t.Fatal("still refused after the block ran out")
	}

	// A relapse: twice the last block (32 s), then 60 s (Max), not 64.
	for _, want := range []time.Duration{32 * time.Second, time.Minute, time.Minute} {
		for !p.Refused(bad) {
			p.Offend(bad, CostBusy, "test")
		}
		now = now.Add(want - time.Second)
		if !p.Refused(bad) {
			t.Fatalf("block shorter than %s", want)
		}
		now = now.Add(time.Second)
		if p.Refused(bad) {
			t.Fatalf("block longer than %s", want)
		}
	}

	// Long after (more than Max), an offence starts from nothing.
	now = now.Add(2 * time.Minute)
	p.Offend(bad, CostTimeout, "test")
	if p.Refused(bad) {
		t.Fatal("a single offence long after the last block refused the address")
	}
	now = now.Add(2 * time.Minute)
	p.sweepLocked(now)
	if len(p.by) != 0 {
		t.Fatalf("sweep kept %d old accounts", len(p.by))
	}

	// IPv6: one account per /64.
	for range 8 {
		p.Offend(from("2001:db8:1:2::7"), CostProtocol, "test")
	}
	if !p.Refused(from("2001:db8:1:2:ffff::1")) || p.Refused(from("2001:db8:1:3::7")) {
		t.Fatal("IPv6 addresses not charged per /64")
	}

	var none *Penalties
	none.Offend(bad, CostTimeout, "test")
	if none.Refused(bad) || NewPenalties(time.Second, 0, nil, nil) != nil {
		t.Fatal("nil or Max 0 Penalties refused")
	}
}

// TestRefusalLog: the first refusal for a reason is logged at once, the
// next ones for it only as one summary line with their count; another
// reason gets its own first line; after a period with nothing to count,
// the next refusal is logged at once again. (The timer's period is an
// hour: the test calls flush itself, as the timer would.)
func TestRefusalLog(t *testing.T) {
	old := SummaryEvery
	SummaryEvery = time.Hour
	defer func() { SummaryEvery = old }()
	var logs strings.Builder
	r := &RefusalLog{Log: slog.New(slog.NewTextHandler(&logs, nil))}
	defer r.Stop()
	for i := range 100 {
		r.Note("busy", fmt.Sprintf("192.0.2.7:%d", 1000+i))
	}
	r.NoteError("bad line", "192.0.2.8:1", errors.New("zzzz"))
	if got := logs.String(); strings.Count(got, "\n") != 2 || !strings.Contains(got, `reason=busy remote=192.0.2.7:1000`) || !strings.Contains(got, `reason="bad line" remote=192.0.2.8:1 error=zzzz`) {
		t.Fatalf("first lines:\n%s", got)
	}
	r.flush()
	if got := logs.String(); strings.Count(got, "\n") != 3 || !strings.Contains(got, "count=99") || !strings.Contains(got, "last_remote=192.0.2.7:1099") {
		t.Fatalf("want one summary line, for busy only:\n%s", got)
	}
	r.Note("busy", "192.0.2.9:1") // counted: busy's window is still open
	r.flush()
	r.flush() // a period with nothing counted closes it
	r.Note("busy", "192.0.2.9:2")
	if got := logs.String(); !strings.Contains(got, "count=1 ") || !strings.Contains(got, "remote=192.0.2.9:2") {
		t.Fatalf("after a quiet period a refusal was not logged at once:\n%s", got)
	}
}

// TestPenaltiesHold: a refused connection is held unread for holdFor, then
// reset; past maxHeld at once, reset at once; Close resets the held ones.
func TestPenaltiesHold(t *testing.T) {
	oldFor, oldMax := holdFor, maxHeld
	holdFor, maxHeld = 2*time.Second, 2 // "at once" is well under 2 s even on a loaded machine
	defer func() { holdFor, maxHeld = oldFor, oldMax }()
	p := NewPenalties(time.Second, time.Minute, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// pair returns a server-side connection and the time its client saw
	// it end (on a channel).
	pair := func() (net.Conn, chan time.Duration) {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		ended := make(chan time.Duration, 1)
		start := time.Now()
		go func() {
			defer c.Close()
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			n, _ := c.Read(make([]byte, 1))
			if n > 0 {
				ended <- -1
				return
			}
			ended <- time.Since(start)
		}()
		return s, ended
	}
	s1, e1 := pair()
	s2, e2 := pair()
	s3, e3 := pair()
	p.Reject(s1)
	p.Reject(s2)
	p.Reject(s3) // past maxHeld: at once
	if d := <-e3; d < 0 || d >= holdFor {
		t.Fatalf("the connection past maxHeld ended after %s, want at once", d)
	}
	for i, e := range []chan time.Duration{e1, e2} {
		if d := <-e; d < holdFor {
			t.Fatalf("held connection %d ended after %s, before holdFor", i+1, d)
		}
	}
	s4, e4 := pair()
	p.Reject(s4)
	p.Close()
	if d := <-e4; d < 0 || d >= holdFor {
		t.Fatalf("Close left a held connection for %s", d)
	}
}
