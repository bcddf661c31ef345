// Package advise measures one repository the way its users reach it and
// says, with the numbers behind each line, how to reach it: which
// transport, protocol v2 or not, SSH connection reuse and what it saves per
// fetch at the user's real round-trip time, which clone option fits the
// use (following GitHub's clone study: a full clone and full fetches for
// developers, shallow for throw-away CI, treeless for CI that needs
// history, blobless + sparse for huge repositories), and never a shallow
// fetch.
//
// Measure does the measuring (package rtt's sessions at no added delay, so
// the proxy only counts round trips); Recommend is a pure function of the
// measurements, so the rules can be checked on recorded ones.
package advise

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"packwire/internal/lab/rtt"
	"packwire/internal/units"
)

// Use is what the clone is for.
type Use string

// Uses.
const (
	UseDev       Use = "dev"        // a developer's clone, fetched for months
	UseCI        Use = "ci"         // CI that builds one commit and deletes the clone
	UseCIHistory Use = "ci-history" // CI that needs history (git log, describe, blame)
	UseHugeRepo  Use = "huge-repo"  // a repository too big to clone whole comfortably
)

// Uses lists every Use.
var Uses = []Use{UseDev, UseCI, UseCIHistory, UseHugeRepo}

// Advice is one recommendation and the evidence behind it.
type Advice struct {
	Topic    string `json:"topic"` // transport, protocol, reuse, clone, fetch
	Text     string `json:"text"`
	Evidence string `json:"evidence"`
}

// hugeClone is where a developer's full clone gets big enough that a
// blobless one is worth its later on-demand fetches.
const hugeClone = 1 << 30

// ParseUse reads a Use by name.
func ParseUse(s string) (Use, error) {
	if !slices.Contains(Uses, Use(s)) {
		return "", fmt.Errorf("unknown use %q (want dev, ci, ci-history or huge-repo)", s)
	}
	return Use(s), nil
}

// Recommend turns measurements into advice for a use.
func Recommend(m Measurements, use Use) ([]Advice, error) {
	if _, err := ParseUse(string(use)); err != nil {
		return nil, err
	}
	var out []Advice
	best, ok := fastestFetch(m)
	if !ok {
		var why []string
		for _, t := range m.Targets {
			if t.Error != "" {
				why = append(why, t.URL+": "+t.Error)
			}
		}
		return nil, fmt.Errorf("no transport could fetch: %s", strings.Join(why, "; "))
	}
	rttOf := func(u string) time.Duration {
		for _, t := range m.Targets {
			if t.URL == u {
				return t.RTT
			}
		}
		return 0
	}
	out = append(out, transportAdvice(m, best))
	if a, ok := protocolAdvice(m, best, rttOf(best.URL)); ok {
		out = append(out, a)
	}
	out = append(out, reuseAdvice(m, best, rttOf)...)
	out = append(out, cloneAdvice(m, use, best))
	out = append(out, Advice{Topic: "fetch",
		Text: "never fetch shallow (git fetch --depth N, --deepen, --shallow-since): fetch fully, even into a shallow clone",
		Evidence: "from GitHub's clone study, not measured here: the shallow boundary stops the server from reusing what it has; " +
			"a shallow fetch into a full linux clone cost 1,000 ms of server CPU against 40 ms for a full fetch (25x), " +
			"while a full fetch into a shallow clone cost 50 ms"})
	return out, nil
}

// fastestFetch is the no-op fetch with the lowest wall over every URL,
// protocol and reuse that worked.
func fastestFetch(m Measurements) (OpResult, bool) {
	var best OpResult
	found := false
	for _, o := range m.Ops {
		if o.Op != rtt.KindFetch || o.Error != "" {
			continue
		}
		if !found || o.Wall < best.Wall {
			best, found = o, true
		}
	}
	return best, found
}

func describe(o OpResult) string {
	s := o.Transport
	if o.Reuse == rtt.ReuseControlMaster {
		s += " with ControlMaster"
	}
	return fmt.Sprintf("%s v%d", s, o.Protocol)
}

func transportAdvice(m Measurements, best OpResult) Advice {
	// The best no-op fetch of each URL.
	perURL := map[string]OpResult{}
	var order []string
	for _, o := range m.Ops {
		if o.Op != rtt.KindFetch || o.Error != "" {
			continue
		}
		cur, seen := perURL[o.URL]
		if !seen {
			order = append(order, o.URL)
		}
		if !seen || o.Wall < cur.Wall {
			perURL[o.URL] = o
		}
	}
	slices.SortFunc(order, func(a, b string) int { return int(perURL[a].Wall - perURL[b].Wall) })
	var ev []string
	for _, u := range order {
		o := perURL[u]
		ev = append(ev, fmt.Sprintf("%s %s (%s, %d round trips)", u, ms(o.Wall), describe(o), o.RoundTrips))
	}
	for _, t := range m.Targets {
		if t.Error != "" {
			note := "did not work: " + firstLine(t.Error)
			if t.Derived {
				note = "tried by convention, not reachable"
			}
			ev = append(ev, fmt.Sprintf("%s %s", t.URL, note))
		}
	}
	text := fmt.Sprintf("fetch from %s", best.URL)
	if len(order) == 1 {
		text += " (the only URL that worked)"
	}
	if best.Transport == rtt.Git {
		// git:// cannot push: name the fastest one that can.
		for _, u := range order {
			if o := perURL[u]; o.Transport != rtt.Git {
				text += fmt.Sprintf("; git:// is read-only, so push to %s", u)
				break
			}
		}
	}
	return Advice{Topic: "transport", Text: text, Evidence: "fastest no-op fetch: " + strings.Join(ev, "; ")}
}

// find is the measured op of a URL, kind, protocol and reuse.
func find(m Measurements, u, kind string, proto int, reuse rtt.Reuse) (OpResult, bool) {
	for _, o := range m.Ops {
		if o.URL == u && o.Op == kind && o.Protocol == proto && o.Reuse == reuse && o.Error == "" {
			return o, true
		}
	}
	return OpResult{}, false
}

func protocolAdvice(m Measurements, best OpResult, rtt time.Duration) (Advice, bool) {
	v0, ok0 := find(m, best.URL, best.Op, 0, best.Reuse)
	v2, ok2 := find(m, best.URL, best.Op, 2, best.Reuse)
	if !ok0 || !ok2 {
		return Advice{}, false
	}
	rtDiff := v0.RoundTrips - v2.RoundTrips
	evidence := fmt.Sprintf("no-op fetch over %s: v2 %d round trips, %s, %s; v0 %d round trips, %s, %s (your RTT %s)",
		best.URL, v2.RoundTrips, units.Bytes(v2.BytesDown), ms(v2.Wall), v0.RoundTrips, units.Bytes(v0.BytesDown), ms(v0.Wall), ms(rtt))
	// Measured walls within 5% of each other are the same.
	switch {
	case v2.Wall*100 < v0.Wall*95 || (rtDiff > 0 && v2.Wall <= v0.Wall):
		text := fmt.Sprintf("use protocol v2 (git config --global protocol.version 2; git's default since 2.26, except in 2.27): a no-op fetch takes %s instead of %s", ms(v2.Wall), ms(v0.Wall))
		if rtDiff > 0 {
			text += fmt.Sprintf(" and %d round trips instead of %d, which alone saves %s at your measured RTT", v2.RoundTrips, v0.RoundTrips, ms(time.Duration(rtDiff)*rtt))
		}
		return Advice{Topic: "protocol", Text: text, Evidence: evidence}, true
	case v0.Wall*100 < v2.Wall*95:
		text := fmt.Sprintf("protocol v2 does not pay off for this repository's no-op fetches: %s against %s with v0", ms(v2.Wall), ms(v0.Wall))
		if rtDiff < 0 {
			text += fmt.Sprintf(", and %d round trips against %d (v2 asks for the capabilities first), which alone costs %s more at your measured RTT", v2.RoundTrips, v0.RoundTrips, ms(time.Duration(-rtDiff)*rtt))
		}
		text += "; v2 pays off with many refs, since it sends only those asked for"
		return Advice{Topic: "protocol", Text: text, Evidence: evidence}, true
	}
	return Advice{Topic: "protocol", Text: "protocol v0 or v2 makes no measurable difference to this repository's fetches (v2 is git's default)", Evidence: evidence}, true
}

func reuseAdvice(m Measurements, best OpResult, rttOf func(string) time.Duration) []Advice {
	var out []Advice
	done := map[string]bool{}
	for _, o := range m.Ops {
		if done[o.URL] || o.Op != rtt.KindFetch || o.Error != "" {
			continue
		}
		switch o.Transport {
		case rtt.SSH:
			proto := best.Protocol
			fresh, ok1 := find(m, o.URL, rtt.KindFetch, proto, rtt.ReuseNone)
			reused, ok2 := find(m, o.URL, rtt.KindFetch, proto, rtt.ReuseControlMaster)
			if !ok1 || !ok2 {
				continue
			}
			done[o.URL] = true
			r := rttOf(o.URL)
			saved := fresh.RoundTrips - reused.RoundTrips
			ev := fmt.Sprintf("no-op fetch over %s (v%d): %d round trips and %s on a new connection, %d round trips and %s on a master connection (your RTT %s)",
				o.URL, proto, fresh.RoundTrips, ms(fresh.Wall), reused.RoundTrips, ms(reused.Wall), ms(r))
			if saved <= 0 && reused.Wall >= fresh.Wall {
				out = append(out, Advice{Topic: "reuse", Text: "reusing SSH connections saves nothing measurable here", Evidence: ev})
				continue
			}
			how := "reuse SSH connections (in ~/.ssh/config for this host: ControlMaster auto, ControlPath ~/.ssh/cm-%C, ControlPersist 10m; not available on Windows)"
			var text string
			if reused.Wall < fresh.Wall {
				text = fmt.Sprintf("%s: a no-op fetch then takes %s instead of %s and %d round trips instead of %d, which alone save %s per fetch at your measured RTT",
					how, ms(reused.Wall), ms(fresh.Wall), reused.RoundTrips, fresh.RoundTrips, ms(time.Duration(saved)*r))
			} else {
				// So near the server the handshake's round trips cost less than the noise.
				text = fmt.Sprintf("%s: a no-op fetch then needs %d round trips instead of %d, worth %s per fetch at your measured RTT; this close to the server the measured times do not differ (%s on a master connection, %s on a new one)",
					how, reused.RoundTrips, fresh.RoundTrips, ms(time.Duration(saved)*r), ms(reused.Wall), ms(fresh.Wall))
			}
			out = append(out, Advice{Topic: "reuse", Text: text, Evidence: ev})
		case rtt.HTTP, rtt.HTTPS:
			proto := best.Protocol
			kept, ok := find(m, o.URL, rtt.KindFetch, proto, rtt.ReuseKeepAlive)
			if !ok {
				continue
			}
			done[o.URL] = true
			text := "HTTP already reuses its connection within each git command; nothing to set"
			ev := fmt.Sprintf("no-op fetch over %s (v%d): %d connection(s), %d round trips, %s kept alive", o.URL, proto, kept.Conns, kept.RoundTrips, ms(kept.Wall))
			if fresh, ok := find(m, o.URL, rtt.KindFetch, proto, rtt.ReuseNone); ok {
				r := rttOf(o.URL)
				ev += fmt.Sprintf("; %d connections, %d round trips, %s with a new connection per request (your RTT %s)", fresh.Conns, fresh.RoundTrips, ms(fresh.Wall), ms(r))
				if saved := fresh.RoundTrips - kept.RoundTrips; saved > 0 {
					text += fmt.Sprintf(" (it saves %d round trips, %s per fetch at your measured RTT, unless a proxy between you closes connections)", saved, ms(time.Duration(saved)*r))
				}
			}
			out = append(out, Advice{Topic: "reuse", Text: text, Evidence: ev})
		}
	}
	return out
}

func cloneAdvice(m Measurements, use Use, best OpResult) Advice {
	clones := map[string]CloneResult{}
	for _, c := range m.Clones {
		if c.Error == "" {
			clones[c.Variant] = c
		}
	}
	u := best.URL
	texts := map[Use]struct{ variant, text string }{
		UseDev:       {CloneFull, fmt.Sprintf("clone fully (git clone %s) and fetch fully: every later fetch and checkout is local and cheap", u)},
		UseCI:        {CloneShallow, fmt.Sprintf("in throw-away CI clone shallow (git clone --depth 1 %s): it does not grow with history", u)},
		UseCIHistory: {CloneTreeless, fmt.Sprintf("in CI that needs history clone treeless (git clone --filter=tree:0 %s): all commits, and only the trees and blobs of the checkout, fetched then", u)},
		UseHugeRepo:  {CloneSparse, fmt.Sprintf("clone blobless and sparse (git clone --filter=blob:none --sparse %s, then git sparse-checkout set DIR...): full history, and only the blobs of your directories", u)},
	}
	want := texts[use]
	full, haveFull := clones[CloneFull]
	chosen, haveChosen := clones[want.variant]
	if !haveChosen || (!haveFull && want.variant != CloneFull) {
		return Advice{Topic: "clone", Text: want.text, Evidence: "clones not measured; the advice is GitHub's clone study's"}
	}
	line := func(c CloneResult) string {
		s := fmt.Sprintf("%s clone %s (%s)", c.Variant, ms(c.Wall), units.Bytes(c.BytesDown))
		if c.CheckoutBytes > 0 {
			s += fmt.Sprintf(" + checkout %s fetching %s in %d round trips", ms(c.CheckoutWall), units.Bytes(c.CheckoutBytes), c.CheckoutRoundTrips)
		} else {
			s += fmt.Sprintf(" + checkout %s", ms(c.CheckoutWall))
		}
		return s
	}
	var ev []string
	for _, v := range CloneVariants {
		if c, ok := clones[v.Name]; ok {
			ev = append(ev, line(c))
		}
	}
	text := want.text
	if use == UseDev {
		if bl, ok := clones[CloneBlobless]; ok && full.BytesDown > hugeClone && (bl.BytesDown+bl.CheckoutBytes)*2 < full.BytesDown {
			text = fmt.Sprintf("clone blobless (git clone --filter=blob:none %s) and fetch fully: blobs are most of this repository (a full clone is %s, blobless with its checkout %s); older versions' blobs come when first needed",
				u, units.Bytes(full.BytesDown), units.Bytes(bl.BytesDown+bl.CheckoutBytes))
		}
	} else {
		saved := full.Total() - chosen.Total()
		if saved > 0 {
			text += fmt.Sprintf("; here %s with its checkout against %s for a full clone (%d%% less time, %s instead of %s)",
				ms(chosen.Total()), ms(full.Total()), int(100*saved/full.Total()), units.Bytes(chosen.BytesDown+chosen.CheckoutBytes), units.Bytes(full.BytesDown))
		} else {
			text += fmt.Sprintf("; on this repository it is no faster yet (%s against %s for a full clone, with checkout): the gap opens as history grows",
				ms(chosen.Total()), ms(full.Total()))
		}
	}
	return Advice{Topic: "clone", Text: text, Evidence: strings.Join(ev, "; ")}
}

func ms(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%d ms", d.Round(time.Millisecond).Milliseconds())
	case d >= time.Millisecond || d <= -time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}

// firstLine is the first line of an error, for evidence that stays short.
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
