package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"packwire/internal/lab/netem"
)

func cmdNetem(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("netem", "netem --upstream HOST:PORT [--listen ADDR] [--delay D] [--jitter D] [--rate BW] [--reset-after BYTES] [--json]",
		`A userspace TCP proxy that makes the link to --upstream slow, far or
unreliable, without root: point a client at --listen instead of the server.

--delay is the round-trip time added (ping would show it): each direction
is delayed by half of it, and the TCP connect costs one round trip too.
Data keeps streaming while delayed and is never reordered. For every
connection it prints the bytes each way and the round trips: the connect,
plus each time the server answered data the client sent (see
"go doc packwire/internal/lab/netem"). Ctrl-C prints the totals and exits.

example: packwire netem --listen 127.0.0.1:9419 --upstream localhost:9418 --delay 100ms
         git ls-remote git://127.0.0.1:9419/team/app`, stderr)
	listen := fs.String("listen", "127.0.0.1:0", "address to listen on")
	upstream := fs.String("upstream", "", "host:port of the server every connection is forwarded to (required)")
	delay := fs.Duration("delay", 0, "round-trip time to add (each direction gets half)")
	jitter := fs.Duration("jitter", 0, "a round trip varies by up to this much either way (each chunk's one-way delay by half); at most --delay")
	rate := fs.String("rate", "0", "bandwidth per direction of each connection: 10mbit, 500kbit, 2MiB/s (0: unlimited)")
	resetAfter := fs.String("reset-after", "0", "reset each connection (RST) after this many bytes both ways together: 100000, 64KiB (0: never)")
	asJSON := fs.Bool("json", false, "print each finished connection as a JSON object on its own line")
	rest, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(args, rest, 0, 0, "netem --upstream HOST:PORT [FLAGS] (no arguments besides flags)"); err != nil {
		return err
	}
	if *upstream == "" {
		return usagef("netem needs --upstream HOST:PORT")
	}
	p := &netem.Proxy{Listen: *listen, Upstream: *upstream, Delay: *delay, Jitter: *jitter}
	if p.Rate, err = netem.ParseRate(*rate); err != nil {
		return usagef("--rate: %v", err)
	}
	if p.ResetAfter, err = netem.ParseSize(*resetAfter); err != nil {
		return usagef("--reset-after: %v", err)
	}

	var outMu sync.Mutex
	p.OnClose = func(c netem.ConnStats) {
		outMu.Lock()
		defer outMu.Unlock()
		if *asJSON {
			json.NewEncoder(stdout).Encode(c)
			return
		}
		fmt.Fprintf(stdout, "conn %d from %s: %s up, %s down, %d round trips (connect + %d turns), %s%s\n",
			c.ID, c.Client, bytesText(c.BytesUp), bytesText(c.BytesDown), c.RoundTrips(), c.Turns,
			ms(c.Closed.Sub(c.Opened)), connEnding(c))
	}
	sigCtx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	addr, err := p.Start(sigCtx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "netem: listening on %s, forwarding to %s: %s round trip added (%s each way), jitter %s, rate %s, reset after %s\n",
		addr, *upstream, *delay, *delay/2, *jitter, netem.FormatRate(p.Rate), resetText(p.ResetAfter))
	<-sigCtx.Done()
	p.Close()
	var total netem.Usage = netem.Delta(nil, p.Conns())
	fmt.Fprintf(stderr, "netem: %d connections, %d round trips, %s up, %s down, %d reset\n",
		total.Conns, total.RoundTrips, bytesText(total.BytesUp), bytesText(total.BytesDown), total.Resets)
	return nil
}

func connEnding(c netem.ConnStats) string {
	switch {
	case c.Reset:
		return ", reset (--reset-after)"
	case c.Err != "":
		return ", " + c.Err
	}
	return ""
}

func resetText(n int64) string {
	if n == 0 {
		return "never"
	}
	return fmt.Sprintf("%d bytes", n)
}
