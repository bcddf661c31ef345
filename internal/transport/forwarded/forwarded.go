// Package forwarded takes a client's address and scheme from the
// X-Forwarded-For and X-Forwarded-Proto headers of a reverse proxy packwire
// trusts, and from nobody else: anyone can send those headers, so they
// count only when the connection comes from a trusted proxy.
package forwarded

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// Trusted is the set of proxy addresses whose forwarding headers are
// believed.
type Trusted []netip.Prefix

// Parse reads a comma separated list of CIDR prefixes or single addresses
// ("10.0.0.0/8,192.0.2.7,::1").
func Parse(list string) (Trusted, error) {
	var t Trusted
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if p, err := netip.ParsePrefix(s); err == nil {
			t = append(t, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("%q is neither an address nor a CIDR prefix (10.0.0.0/8, 192.0.2.7, ::1)", s)
		}
		t = append(t, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return t, nil
}

// String is the list as Parse reads it.
func (t Trusted) String() string {
	s := make([]string, len(t))
	for i, p := range t {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// Contains reports whether a is a trusted proxy's address.
func (t Trusted) Contains(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range t {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

type schemeKey struct{}

// Handler passes requests to next with r.RemoteAddr set to the client's
// address when the connection comes from a trusted proxy: the rightmost
// address of X-Forwarded-For that is not itself a trusted proxy (each
// proxy appends the address it was connected from; the ones left of the
// first untrusted address could be forged by the client). The scheme the
// client used (X-Forwarded-Proto, as the nearest proxy sets it) is what
// Scheme then returns. From any other peer the headers are ignored.
func (t Trusted) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		peer, ok := addrOf(r.RemoteAddr)
		if len(t) == 0 || !ok || !t.Contains(peer) {
			next.ServeHTTP(w, r)
			return
		}
		r2 := r.Clone(r.Context())
		if client, ok := t.client(r.Header.Values("X-Forwarded-For")); ok {
			r2.RemoteAddr = client.String()
		}
		if proto := lastValue(r.Header.Values("X-Forwarded-Proto")); proto == "https" || proto == "http" {
			r2 = r2.WithContext(context.WithValue(r2.Context(), schemeKey{}, proto))
		}
		next.ServeHTTP(w, r2)
	})
}

// client walks X-Forwarded-For from the right past trusted proxies.
func (t Trusted) client(headers []string) (netip.Addr, bool) {
	var hops []string
	for _, h := range headers {
		hops = append(hops, strings.Split(h, ",")...)
	}
	var last netip.Addr
	for i := len(hops) - 1; i >= 0; i-- {
		a, ok := addrOf(strings.TrimSpace(hops[i]))
		if !ok {
			// Garbage: nothing left of it can be believed; the last
			// proxy that forwarded it is the best we know.
			return last, last.IsValid()
		}
		if !t.Contains(a) {
			return a, true
		}
		last = a
	}
	// Every hop is a trusted proxy: the leftmost is the origin we know.
	return last, last.IsValid()
}

// Scheme is "https" or "http": as the trusted proxy said the client
// connected, else as the request reached packwire.
func Scheme(r *http.Request) string {
	if s, ok := r.Context().Value(schemeKey{}).(string); ok {
		return s
	}
	if r.TLS != nil {
		return "https"
	}
	return "http"
}

// addrOf reads an address with or without a port ("192.0.2.7:5000",
// "[::1]:80", "::1", "192.0.2.7").
func addrOf(s string) (netip.Addr, bool) {
	if host, _, err := net.SplitHostPort(s); err == nil {
		s = host
	}
	s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}

func lastValue(headers []string) string {
	if len(headers) == 0 {
		return ""
	}
	parts := strings.Split(headers[len(headers)-1], ",")
	return strings.ToLower(strings.TrimSpace(parts[len(parts)-1]))
}
