package rtt

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// Transports a Target can have.
const (
	Git   = "git"
	HTTP  = "http"
	HTTPS = "https"
	SSH   = "ssh"
)

// Target is a Git remote URL, taken apart so its connections can be sent
// through a proxy: git://, http://, https://, ssh:// or scp-like
// [user@]host:path.
type Target struct {
	URL       string `json:"url"`       // as given
	Transport string `json:"transport"` // Git, HTTP, HTTPS or SSH
	User      string `json:"user,omitempty"`
	Host      string `json:"host"` // as written (for SSH it may be an alias of ~/.ssh/config)
	Port      int    `json:"port"` // the URL's port or the transport's default
	// DialAddr is where connections really go (host:port); for SSH the
	// caller may replace it with what ssh's configuration resolves.
	DialAddr string `json:"dial_addr"`

	parsed *url.URL // nil for scp-like
}

var defaultPorts = map[string]int{Git: 9418, HTTP: 80, HTTPS: 443, SSH: 22}

// ParseURL reads a remote URL the way git does for the transports it
// measures. Local paths and file:// have no network to measure.
func ParseURL(s string) (Target, error) {
	if s == "" {
		return Target{}, errors.New("empty URL")
	}
	if strings.ContainsAny(s, " \t\r\n\x00") {
		return Target{}, fmt.Errorf("invalid URL %q: contains white space or control characters", s)
	}
	if scheme, _, ok := strings.Cut(s, "://"); ok {
		t := Target{URL: s}
		switch strings.ToLower(scheme) {
		case "git":
			t.Transport = Git
		case "http":
			t.Transport = HTTP
		case "https":
			t.Transport = HTTPS
		case "ssh", "git+ssh", "ssh+git":
			t.Transport = SSH
		case "file":
			return Target{}, fmt.Errorf("%s is a local repository: there is no network to measure", s)
		default:
			return Target{}, fmt.Errorf("unsupported URL scheme %q in %s (want git://, http://, https://, ssh:// or user@host:path)", scheme, s)
		}
		u, err := url.Parse(s)
		if err != nil {
			return Target{}, fmt.Errorf("invalid URL %s: %v", s, err)
		}
		if u.Hostname() == "" {
			return Target{}, fmt.Errorf("invalid URL %s: no host", s)
		}
		if u.Path == "" || u.Path == "/" {
			return Target{}, fmt.Errorf("invalid URL %s: no repository path", s)
		}
		t.Host = u.Hostname()
		if strings.HasPrefix(t.Host, "-") || (u.User != nil && strings.HasPrefix(u.User.Username(), "-")) {
			return Target{}, fmt.Errorf("invalid URL %s: a host or user may not start with '-'", s)
		}
		t.Port = defaultPorts[t.Transport]
		if p := u.Port(); p != "" {
			n, err := strconv.Atoi(p)
			if err != nil || n < 1 || n > 65535 {
				return Target{}, fmt.Errorf("invalid URL %s: bad port %q", s, p)
			}
			t.Port = n
		}
		if u.User != nil {
			t.User = u.User.Username()
		}
		t.parsed = u
		t.DialAddr = net.JoinHostPort(t.Host, strconv.Itoa(t.Port))
		return t, nil
	}
	// scp-like: [user@]host:path, where host has no slash before the colon
	// (git reads "a/b:c" as a local path).
	colon := strings.IndexByte(s, ':')
	slash := strings.IndexByte(s, '/')
	if colon <= 0 || (slash >= 0 && slash < colon) {
		return Target{}, fmt.Errorf("%q is not a remote URL (want git://, http://, https://, ssh:// or user@host:path)", s)
	}
	hostPart, path := s[:colon], s[colon+1:]
	t := Target{URL: s, Transport: SSH, Port: 22}
	if strings.HasPrefix(hostPart, "[") {
		return Target{}, fmt.Errorf("%s: the bracketed [host:port]:path form is not supported here; write ssh://host:port/path", s)
	}
	if user, host, ok := strings.Cut(hostPart, "@"); ok {
		t.User, hostPart = user, host
	}
	if hostPart == "" || path == "" {
		return Target{}, fmt.Errorf("invalid URL %s: want user@host:path", s)
	}
	if strings.ContainsAny(hostPart, "@[]") || strings.HasPrefix(hostPart, "-") || strings.HasPrefix(t.User, "-") {
		return Target{}, fmt.Errorf("invalid host in %s", s)
	}
	t.Host = hostPart
	t.DialAddr = net.JoinHostPort(t.Host, "22")
	return t, nil
}

// Through returns the URL that sends git through a proxy listening on
// proxyAddr, and the git -c settings it needs. SSH URLs stay as they are:
// the proxy goes into ssh's own options (SSHOptions).
func (t Target) Through(proxyAddr string) (string, []string) {
	switch t.Transport {
	case Git, HTTP, HTTPS:
		_, port, _ := net.SplitHostPort(proxyAddr)
		u := *t.parsed
		if t.Transport == Git || net.ParseIP(t.Host) != nil {
			u.Host = net.JoinHostPort(hostOf(proxyAddr), port)
			return u.String(), nil
		}
		// Keep the host name, for TLS (SNI and the certificate) and
		// virtual hosts, and make curl resolve it to the proxy.
		u.Host = net.JoinHostPort(t.Host, port)
		return u.String(), []string{"http.curloptResolve=" + t.Host + ":" + port + ":" + hostOf(proxyAddr)}
	}
	return t.URL, nil
}

// SSHOptions are the ssh options that make ssh connect to the proxy
// instead of the server, keeping the URL (and the user's ~/.ssh/config for
// the host). Options given first win over git's own -p.
func (t Target) SSHOptions(proxyAddr string) []string {
	host, port, _ := net.SplitHostPort(proxyAddr)
	return []string{"-o", "HostName=" + host, "-o", "Port=" + port, "-o", "ProxyCommand=none", "-o", "ProxyJump=none"}
}

func hostOf(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return host
}
