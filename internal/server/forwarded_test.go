package server

import (
	"context"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"packwire/internal/store"
	"packwire/internal/transport/forwarded"
)

// TestTrustedProxies sends forged X-Forwarded-For and X-Forwarded-Proto over
// real HTTP. From a peer not in TrustedProxies they change nothing: the
// per-client cap counts the peer's address. From a trusted peer the client
// named there (the rightmost address not itself a trusted proxy; anything
// left of it could be the client's own forgery) is what the running
// request shows, the per-client cap counts, the governor records, and the
// scheme the dashboard's session cookie follows.
func TestTrustedProxies(t *testing.T) {
	t.Parallel()
	for _, trusted := range []bool{false, true} {
		name := "untrusted"
		if trusted {
			name = "trusted"
		}
		t.Run(name, func(t *testing.T) {
			s := startServer(t, func(c *Config) {
				c.MaxRequestsPerClient = 1
				c.InitTimeout, c.RequestMinRate = 30*time.Second, 1
				if trusted {
					c.TrustedProxies = forwarded.Trusted{netip.MustParsePrefix("127.0.0.0/8")}
				}
			})
			s.seed(t, "team/app")
			addr := s.HTTPAddr.String()

			// Client A holds a request open (its body trickles), counted
			// against its address.
			a := rawHTTP(t, addr, "POST", "/team/app/git-upload-pack", "Git-Protocol: version=2",
				"Content-Type: application/x-git-upload-pack-request", "Transfer-Encoding: chunked",
				"X-Forwarded-For: 198.51.100.1, 203.0.113.9")
			a.Write([]byte("4\r\n0014\r\n"))
			waitActive(t, s, 1)
			remote := s.Pipeline.Active()[0].Remote
			if trusted && remote != "203.0.113.9" || !trusted && !strings.HasPrefix(remote, "127.0.0.1:") {
				t.Fatalf("the running request's remote is %q", remote)
			}

			// Client B, another forwarded address: its own slot if trusted,
			// A's (the proxy's address) if not.
			out, err := s.env.Run(t.TempDir(), nil, "-c", "http.extraHeader=X-Forwarded-For: 192.0.2.50",
				"ls-remote", s.httpURL("team/app"))
			if trusted && err != nil {
				t.Fatalf("client B was refused: %v\n%s", err, out)
			}
			if !trusted && (err == nil || !strings.Contains(out, "too many concurrent requests from anonymous@127.0.0.1 (max 1)")) {
				t.Fatalf("a forged X-Forwarded-For from an untrusted peer got its own slot: %v\n%s", err, out)
			}

			// A again, by its forwarded address: refused when trusted.
			a2 := rawHTTP(t, addr, "POST", "/team/app/git-upload-pack", "Git-Protocol: version=2",
				"Content-Type: application/x-git-upload-pack-request", "Content-Length: 4",
				"X-Forwarded-For: 203.0.113.9")
			a2.Write([]byte("0000"))
			status, text, err := response(a2, 10*time.Second)
			if trusted && (status != http.StatusServiceUnavailable || !strings.Contains(text, "from anonymous@203.0.113.9 (max 1)")) {
				t.Fatalf("client A's second request: %d %q %v", status, text, err)
			}
			a.Close()

			// The governor records B by its forwarded address.
			if trusted {
				deadline := time.Now().Add(10 * time.Second)
				for {
					recs, err := s.Governor.Last(context.Background(), 20)
					if err != nil {
						t.Fatal(err)
					}
					found := false
					for _, r := range recs {
						found = found || r.Remote == "192.0.2.50" && r.Result == "ok"
					}
					if found {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("no record of 192.0.2.50's request: %+v", recs)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}

			// The session cookie is Secure only if a trusted proxy says the
			// browser came over https.
			if err := s.Data.Store.SetGrant(context.Background(), store.Grant{User: "alice", RepoPattern: "**", Role: "admin"}); err != nil {
				t.Fatal(err)
			}
			req, _ := http.NewRequest("POST", "http://"+addr+"/-/login", strings.NewReader(url.Values{"token": {s.token}}.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Origin", "https://"+addr)
			req.Header.Set("X-Forwarded-Proto", "https")
			client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			cookies := resp.Cookies()
			if resp.StatusCode != http.StatusSeeOther || len(cookies) != 1 || cookies[0].Secure != trusted {
				t.Fatalf("login: %d, cookies %v; want one, Secure=%v", resp.StatusCode, cookies, trusted)
			}
		})
	}
}
