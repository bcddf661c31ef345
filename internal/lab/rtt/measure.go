// Package rtt measures what network latency costs git: it sends each git
// operation (ls-remote, a no-op fetch, a small clone, or any clone variant)
// through a netem proxy at several added round-trip times, with protocol v0
// and v2 and with and without connection reuse, and reports the round
// trips the proxy counted and the wall time at each delay, with the fit
// wall = a + b x RTT (b is the number of round trips the operation really
// waits for; a is what it costs without added latency).
//
// Any server works: the proxy dials the URL's host and port, and the URL
// git is given points at the proxy (git://, http://), or resolves to it
// (https:// keeps its host name through http.curloptResolve, so TLS still
// verifies), or ssh is told to connect there (-o HostName -o Port, so the
// URL and ~/.ssh/config stay as they are). SSH host keys go to a
// known_hosts of the scratch directory (StrictHostKeyChecking=accept-new).
package rtt

import (
	"context"
	"fmt"
	"math"
	"net"
	"time"

	"packwire/internal/lab/compare"
)

// Plan is what Measure runs for each target.
type Plan struct {
	Delays    []time.Duration // added round-trip times; the fit needs two or more
	Protocols []int           // protocol versions, e.g. 0 and 2
	Ops       []Op
	Runs      int // runs per point; the median wall counts (default 1)
}

// Point is one operation at one delay.
type Point struct {
	Delay time.Duration   `json:"delay"`
	Wall  time.Duration   `json:"wall"`  // median of the runs
	Walls []time.Duration `json:"walls"` // every run
}

// Row is one operation, protocol and reuse against one URL, at every delay.
type Row struct {
	URL       string `json:"url"`
	Transport string `json:"transport"`
	Op        string `json:"op"`
	Protocol  int    `json:"protocol"`
	Reuse     Reuse  `json:"reuse"`
	// RoundTrips are counted by the proxy (connects + turns, see package
	// netem), the fewest over all runs and delays; RoundTripsMax the most
	// (they differ only if the exchange itself varied).
	RoundTrips    int     `json:"round_trips"`
	RoundTripsMax int     `json:"round_trips_max"`
	Conns         int     `json:"conns"`      // connections opened per run (the fewest)
	BytesDown     int64   `json:"bytes_down"` // server to client per run (the last)
	Points        []Point `json:"points"`
	Fit           Fit     `json:"fit"`
	Error         string  `json:"error,omitempty"`

	samples int
}

// Fit is wall = Base + PerRTT x RTT, least squares over the points'
// median walls.
type Fit struct {
	OK     bool          `json:"ok"` // false with fewer than two distinct delays
	Base   time.Duration `json:"base"`
	PerRTT float64       `json:"per_rtt"` // effective round trips
}

// FitLine fits wall = a + b x delay to the points.
func FitLine(points []Point) Fit {
	var n, sx, sy, sxx, sxy float64
	for _, p := range points {
		x, y := p.Delay.Seconds(), p.Wall.Seconds()
		n++
		sx += x
		sy += y
		sxx += x * x
		sxy += x * y
	}
	den := n*sxx - sx*sx
	if n < 2 || math.Abs(den) < 1e-12 {
		return Fit{}
	}
	b := (n*sxy - sx*sy) / den
	a := (sy - b*sx) / n
	return Fit{OK: true, Base: time.Duration(a * float64(time.Second)), PerRTT: b}
}

// Measure runs the plan against each target, each reuse variant its
// transport has, at each delay, and returns one row per target, reuse,
// protocol and operation. A failing operation fills its row's Error and
// the rest goes on. progress, if set, is told about each run.
func (c *Client) Measure(ctx context.Context, targets []Target, plan Plan, progress func(string)) []Row {
	if plan.Runs < 1 {
		plan.Runs = 1
	}
	say := func(format string, args ...any) {
		if progress != nil {
			progress(fmt.Sprintf(format, args...))
		}
	}
	var rows []*Row
	for _, t := range targets {
		for _, reuse := range ReusesFor(t.Transport) {
			first := len(rows)
			for _, proto := range plan.Protocols {
				for _, op := range plan.Ops {
					rows = append(rows, &Row{URL: t.URL, Transport: t.Transport, Op: op.Name, Protocol: proto, Reuse: reuse})
				}
			}
			group := rows[first:]
			for _, delay := range plan.Delays {
				if ctx.Err() != nil {
					break
				}
				s, err := c.Open(ctx, t, reuse, delay)
				if err != nil {
					for _, r := range group {
						r.Error = err.Error()
					}
					say("%s %s at %v: %v", t.URL, reuse, delay, err)
					continue
				}
				i := 0
				for _, proto := range plan.Protocols {
					for _, op := range plan.Ops {
						r := group[i]
						i++
						if r.Error != "" {
							continue
						}
						point := Point{Delay: delay}
						for range plan.Runs {
							sample, err := s.Run(ctx, op, proto)
							if err != nil {
								r.Error = err.Error()
								say("%s %s v%d %s at %v: %v", t.URL, op.Name, proto, reuse, delay, err)
								break
							}
							r.add(sample)
							point.Walls = append(point.Walls, sample.Wall)
							say("%s %s v%d %s at %v: %v, %d round trips", t.URL, op.Name, proto, reuse, delay, sample.Wall.Round(time.Millisecond), sample.Usage.RoundTrips)
						}
						if r.Error == "" {
							point.Wall = compare.Median(point.Walls)
							r.Points = append(r.Points, point)
						}
					}
				}
				s.Close()
			}
		}
	}
	out := make([]Row, len(rows))
	for i, r := range rows {
		r.Fit = FitLine(r.Points)
		out[i] = *r
	}
	return out
}

func (r *Row) add(s Sample) {
	u := s.Usage
	if r.samples == 0 || u.RoundTrips < r.RoundTrips {
		r.RoundTrips = u.RoundTrips
	}
	if r.samples == 0 || u.Conns < r.Conns {
		r.Conns = u.Conns
	}
	r.RoundTripsMax = max(r.RoundTripsMax, u.RoundTrips)
	r.BytesDown = u.BytesDown
	r.samples++
}

// ConnectTime estimates the real round-trip time to addr: the median of n
// TCP connects (a connect is one round trip), each bounded by timeout.
func ConnectTime(ctx context.Context, addr string, n int, timeout time.Duration) (time.Duration, error) {
	var times []time.Duration
	var lastErr error
	d := net.Dialer{Timeout: timeout}
	for range max(n, 1) {
		start := time.Now()
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			lastErr = err
			continue
		}
		times = append(times, time.Since(start))
		conn.Close()
	}
	if len(times) == 0 {
		return 0, fmt.Errorf("cannot connect to %s: %v", addr, lastErr)
	}
	return compare.Median(times), nil
}
