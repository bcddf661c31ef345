package accept

import (
	"net"
	"net/netip"
	"testing"
)

// TestStartups: an address gets max places, a done gives one back (once,
// however often it is called), other addresses and exempt ones are apart.
func TestStartups(t *testing.T) {
	proxy := netip.MustParseAddr("10.0.0.1")
	s := NewStartups(2, func(a netip.Addr) bool { return a == proxy })
	from := func(ip string) net.Addr { return &net.TCPAddr{IP: net.ParseIP(ip), Port: 4000} }
	done1, ok1 := s.Begin(from("192.0.2.7"))
	_, ok2 := s.Begin(from("::ffff:192.0.2.7")) // the same address, IPv4 in IPv6
	if _, ok := s.Begin(from("192.0.2.7")); !ok1 || !ok2 || ok {
		t.Fatalf("Begin: %v %v then %v, want true true false", ok1, ok2, ok)
	}
	if _, ok := s.Begin(from("192.0.2.8")); !ok {
		t.Fatal("another address was refused")
	}
	for range 3 {
		if _, ok := s.Begin(from("10.0.0.1")); !ok {
			t.Fatal("an exempt address was refused")
		}
	}
	done1()
	done1()
	if _, ok := s.Begin(from("192.0.2.7")); !ok {
		t.Fatal("done gave no place back")
	}
	if _, ok := s.Begin(from("192.0.2.7")); ok {
		t.Fatal("a second done gave a place back twice")
	}
	if NewStartups(0, nil) != nil {
		t.Fatal("max 0 bounds something")
	}
	var none *Startups
	if _, ok := none.Begin(from("192.0.2.7")); !ok {
		t.Fatal("nil Startups refused")
	}
}
