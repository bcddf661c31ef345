package forwarded

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestHandler: which address and scheme a request ends up with, for peers
// trusted or not and X-Forwarded-For chains honest, forged or broken.
func TestHandler(t *testing.T) {
	trusted, err := Parse("10.0.0.0/8, 192.0.2.7,::1")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		peer, xff, proto string
		wantAddr, want   string
	}{
		{"203.0.113.5:4000", "198.51.100.1", "https", "203.0.113.5:4000", "http"},     // untrusted peer: ignored
		{"192.0.2.7:4000", "198.51.100.1", "https", "198.51.100.1", "https"},          // one trusted proxy
		{"192.0.2.7:4000", "6.6.6.6, 198.51.100.1", "http", "198.51.100.1", "http"},   // the client forged 6.6.6.6
		{"192.0.2.7:4000", "198.51.100.1, 10.1.1.1", "", "198.51.100.1", "http"},      // two trusted proxies
		{"192.0.2.7:4000", "10.2.2.2, 10.1.1.1", "", "10.2.2.2", "http"},              // all hops trusted: the leftmost
		{"192.0.2.7:4000", "198.51.100.1, junk, 10.1.1.1", "", "10.1.1.1", "http"},    // garbage: the last proxy before it
		{"192.0.2.7:4000", "", "gopher", "192.0.2.7:4000", "http"},                    // no header, unknown scheme
		{"[::1]:4000", "2001:db8::5", "https", "2001:db8::5", "https"},                // IPv6
		{"192.0.2.7:4000", "[2001:db8::5]:1234", "", "2001:db8::5", "http"},           // with a port
		{"[::ffff:192.0.2.7]:4000", "198.51.100.1", "https", "198.51.100.1", "https"}, // v4-mapped peer
		{"192.0.2.8:4000", "198.51.100.1", "https", "192.0.2.8:4000", "http"},         // next to a trusted one
	}
	for _, c := range cases {
		var gotAddr, gotScheme string
		h := trusted.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			gotAddr, gotScheme = r.RemoteAddr, Scheme(r)
		}))
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = c.peer
		if c.xff != "" {
			r.Header.Set("X-Forwarded-For", c.xff)
		}
		if c.proto != "" {
			r.Header.Set("X-Forwarded-Proto", c.proto)
		}
		h.ServeHTTP(httptest.NewRecorder(), r)
		if gotAddr != c.wantAddr || gotScheme != c.want {
			t.Errorf("peer %s, X-Forwarded-For %q, proto %q: got %s %s, want %s %s", c.peer, c.xff, c.proto, gotAddr, gotScheme, c.wantAddr, c.want)
		}
	}
	// Several X-Forwarded-For headers are one list.
	var got string
	h := trusted.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = r.RemoteAddr }))
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "10.0.0.1:1"
	r.Header.Add("X-Forwarded-For", "198.51.100.1")
	r.Header.Add("X-Forwarded-For", "198.51.100.2, 10.9.9.9")
	h.ServeHTTP(httptest.NewRecorder(), r)
	if got != "198.51.100.2" {
		t.Errorf("two headers: %s", got)
	}
}

func TestParse(t *testing.T) {
	tr, err := Parse("10.0.0.1/8,192.0.2.7, 2001:db8::/32")
	if err != nil || tr.String() != "10.0.0.0/8,192.0.2.7/32,2001:db8::/32" {
		t.Fatalf("Parse: %v %v", tr, err)
	}
	for _, bad := range []string{"10.0.0.0/33", "proxy.example", "10.0.0"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q): no error", bad)
		}
	}
	if tr, err := Parse(""); err != nil || len(tr) != 0 {
		t.Errorf("Parse(\"\"): %v %v", tr, err)
	}
}
