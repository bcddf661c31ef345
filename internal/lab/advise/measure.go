package advise

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"packwire/internal/lab/rtt"
)

// Target is one URL of the repository and what was learnt about it.
type Target struct {
	URL       string        `json:"url"`
	Transport string        `json:"transport"`
	Derived   bool          `json:"derived,omitempty"` // tried by convention, not given
	RTT       time.Duration `json:"rtt"`               // median TCP connect time: the real round-trip time
	Error     string        `json:"error,omitempty"`   // unreachable, or ls-remote failed
}

// OpResult is one operation over one URL with one protocol and reuse.
type OpResult struct {
	URL        string        `json:"url"`
	Transport  string        `json:"transport"`
	Op         string        `json:"op"` // rtt.KindLsRemote or rtt.KindFetch
	Protocol   int           `json:"protocol"`
	Reuse      rtt.Reuse     `json:"reuse"`
	RoundTrips int           `json:"round_trips"`
	Conns      int           `json:"conns"`
	BytesDown  int64         `json:"bytes_down"`
	Wall       time.Duration `json:"wall"` // median
	Error      string        `json:"error,omitempty"`
}

// Clone variants.
const (
	CloneFull     = "full"
	CloneShallow  = "depth1"
	CloneTreeless = "treeless"
	CloneBlobless = "blobless"
	// CloneSparse is blobless and sparse: the checkout (cone mode, only
	// the top-level files until sparse-checkout set) fetches only its blobs.
	CloneSparse = "sparse"
)

// CloneVariants are the clone options measured, with their git arguments.
var CloneVariants = []struct {
	Name string
	Args []string
}{
	{CloneFull, nil},
	{CloneShallow, []string{"--depth", "1"}},
	{CloneTreeless, []string{"--filter=tree:0"}},
	{CloneBlobless, []string{"--filter=blob:none"}},
	{CloneSparse, []string{"--filter=blob:none", "--sparse"}},
}

// CloneResult is one clone variant, then a checkout of HEAD.
type CloneResult struct {
	Variant            string        `json:"variant"`
	URL                string        `json:"url"`
	Protocol           int           `json:"protocol"`
	Wall               time.Duration `json:"wall"`
	BytesDown          int64         `json:"bytes_down"`
	RoundTrips         int           `json:"round_trips"`
	CheckoutWall       time.Duration `json:"checkout_wall"`
	CheckoutBytes      int64         `json:"checkout_bytes"`       // what the checkout had to fetch (partial clones)
	CheckoutRoundTrips int           `json:"checkout_round_trips"` // and the round trips that cost
	Error              string        `json:"error,omitempty"`
}

// Total is the clone and its checkout together.
func (c CloneResult) Total() time.Duration { return c.Wall + c.CheckoutWall }

// Measurements are everything Recommend reasons from.
type Measurements struct {
	Targets []Target      `json:"targets"`
	Ops     []OpResult    `json:"ops"`
	Clones  []CloneResult `json:"clones"`
}

// Options control Measure.
type Options struct {
	Client *rtt.Client
	Runs   int      // runs of each operation (median); default 3
	Derive bool     // also try the repository over the other transports, on their default ports
	Clones []string // clone variants to measure (default all); none: set NoClones
	// NoClones skips the clone measurements (the transport and protocol
	// advice still comes).
	NoClones bool
	// AddedRTT measures as if the server were this much farther away: the
	// proxy delays by it, and it is added to the measured RTT.
	AddedRTT time.Duration
	Progress func(string)
}

// Measure measures a repository reachable at urls (several transports of
// the same repository): real RTT, ls-remote and no-op fetch with protocol
// v0 and v2 and each reuse variant, through a proxy that adds nothing but
// counts round trips; then the clone variants over the fastest way.
func Measure(ctx context.Context, urls []string, o Options) (Measurements, error) {
	if o.Runs < 1 {
		o.Runs = 3
	}
	say := func(format string, args ...any) {
		if o.Progress != nil {
			o.Progress(fmt.Sprintf(format, args...))
		}
	}
	var m Measurements
	var targets []rtt.Target
	seen := map[string]bool{}
	for _, u := range urls {
		t, err := rtt.ParseURL(u)
		if err != nil {
			return m, err
		}
		o.Client.ResolveSSH(ctx, &t)
		targets = append(targets, t)
		seen[t.Transport] = true
	}
	if o.Derive {
		for _, t := range derive(targets[0], seen) {
			o.Client.ResolveSSH(ctx, &t)
			targets = append(targets, t)
		}
	}
	var reachable []rtt.Target
	for i, t := range targets {
		info := Target{URL: t.URL, Transport: t.Transport, Derived: i >= len(urls)}
		d, err := rtt.ConnectTime(ctx, t.DialAddr, 5, 2*time.Second)
		if err != nil {
			info.Error = err.Error()
			say("%s: %v", t.URL, err)
		} else {
			info.RTT = d + o.AddedRTT
			say("%s: connect time (real RTT) %v, measuring at %v", t.URL, d.Round(10*time.Microsecond), info.RTT.Round(10*time.Microsecond))
		}
		m.Targets = append(m.Targets, info)
		if err == nil {
			reachable = append(reachable, t)
		}
	}
	// ls-remote and the no-op fetch at the added delay: package rtt's
	// measurement with one delay, its rows mapped to OpResults.
	plan := rtt.Plan{Delays: []time.Duration{o.AddedRTT}, Protocols: []int{0, 2}, Ops: []rtt.Op{rtt.LsRemote, rtt.NoopFetch}, Runs: o.Runs}
	kind := map[string]string{}
	for _, op := range plan.Ops {
		kind[op.Name] = op.Kind
	}
	first := map[string]bool{}
	for _, r := range o.Client.Measure(ctx, reachable, plan, o.Progress) {
		op := OpResult{URL: r.URL, Transport: r.Transport, Op: kind[r.Op], Protocol: r.Protocol, Reuse: r.Reuse,
			RoundTrips: r.RoundTrips, Conns: r.Conns, BytesDown: r.BytesDown, Error: r.Error}
		if len(r.Points) > 0 {
			op.Wall = r.Points[0].Wall
		}
		if !first[r.URL] {
			first[r.URL] = true
			if r.Error != "" {
				// The URL's very first command (v0 ls-remote) failed: the URL does not work.
				setError(&m, r.URL, errors.New(r.Error))
			}
		}
		m.Ops = append(m.Ops, op)
	}
	if o.NoClones {
		return m, nil
	}
	best, ok := fastestFetch(m)
	if !ok {
		return m, fmt.Errorf("no transport worked for %s", strings.Join(urls, ", "))
	}
	var target rtt.Target
	for _, t := range reachable {
		if t.URL == best.URL {
			target = t
		}
	}
	s, err := o.Client.Open(ctx, target, best.Reuse, o.AddedRTT)
	if err != nil {
		return m, err
	}
	defer s.Close()
	for _, v := range CloneVariants {
		if len(o.Clones) > 0 && !slices.Contains(o.Clones, v.Name) {
			continue
		}
		c := CloneResult{Variant: v.Name, URL: target.URL, Protocol: best.Protocol}
		sample, err := s.Run(ctx, rtt.Op{Name: "clone " + v.Name, Kind: rtt.KindClone, Clone: v.Args, Checkout: true}, best.Protocol)
		if err != nil {
			c.Error = err.Error()
		}
		c.Wall, c.BytesDown, c.RoundTrips = sample.Wall, sample.Usage.BytesDown, sample.Usage.RoundTrips
		c.CheckoutWall, c.CheckoutBytes, c.CheckoutRoundTrips = sample.CheckoutWall, sample.CheckoutUsage.BytesDown, sample.CheckoutUsage.RoundTrips
		say("clone %s over %s: %v + checkout %v, %d bytes", v.Name, target.URL, c.Wall.Round(time.Millisecond), c.CheckoutWall.Round(time.Millisecond), c.BytesDown+c.CheckoutBytes)
		m.Clones = append(m.Clones, c)
	}
	return m, nil
}

func setError(m *Measurements, u string, err error) {
	for i := range m.Targets {
		if m.Targets[i].URL == u && m.Targets[i].Error == "" {
			m.Targets[i].Error = err.Error()
		}
	}
}

// derive names the repository over the transports not given, on their
// default ports (git:// 9418, https:// 443, ssh:// as git@ on 22), keeping
// only those whose port accepts a connection within a second. Measure then
// drops those whose ls-remote fails.
func derive(from rtt.Target, have map[string]bool) []rtt.Target {
	path := pathOf(from)
	if path == "" {
		return nil
	}
	host := from.Host
	if from.Transport == rtt.SSH {
		// An alias of ~/.ssh/config: derive from where it really goes.
		if h, _, err := net.SplitHostPort(from.DialAddr); err == nil {
			host = h
		}
	}
	hostInURL := host
	if strings.Contains(host, ":") {
		hostInURL = "[" + host + "]"
	}
	candidates := []struct{ transport, url string }{
		{rtt.Git, "git://" + hostInURL + path},
		{rtt.HTTPS, "https://" + hostInURL + path},
		{rtt.SSH, "ssh://git@" + hostInURL + path},
	}
	var out []rtt.Target
	for _, c := range candidates {
		if have[c.transport] || (c.transport == rtt.HTTPS && have[rtt.HTTP]) {
			continue
		}
		t, err := rtt.ParseURL(c.url)
		if err != nil {
			continue
		}
		conn, err := net.DialTimeout("tcp", t.DialAddr, time.Second)
		if err != nil {
			continue
		}
		conn.Close()
		out = append(out, t)
	}
	return out
}

// pathOf is the repository path of a target, with a leading slash.
func pathOf(t rtt.Target) string {
	if strings.Contains(t.URL, "://") {
		u, err := url.Parse(t.URL)
		if err != nil {
			return ""
		}
		return u.Path
	}
	_, p, _ := strings.Cut(t.URL, ":")
	return "/" + strings.TrimPrefix(p, "/")
}
