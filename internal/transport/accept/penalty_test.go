package accept

import (
	"io"
	"log/slog"
	"net"
	"net/netip"
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

	var none *Penalties
	none.Offend(bad, CostTimeout, "test")
	if none.Refused(bad) || NewPenalties(time.Second, 0, nil, nil) != nil {
		t.Fatal("nil or Max 0 Penalties refused")
	}
}
