package pipeline

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestNegotiationPaceStretches: a v0 client's input is paced from the
// first byte of each stretch (the want section, a batch of haves) to the
// flush or "done" that ends it, not while it waits for the server, and
// nothing after "done".
func TestNegotiationPaceStretches(t *testing.T) {
	g := newNegotiationPace(nil, Pace{Grace: time.Hour, MinRate: 1}, &bytes.Buffer{}, func(error) {})
	defer g.stop()
	feed := func(b []byte) {
		for i := range b { // a byte a read: packets span reads
			g.feed(b[i : i+1])
		}
	}
	paced := func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.stopWatch != nil
	}
	wants := pkts("want "+oidA+" multi_ack_detailed", "")
	haves := pkts("have "+oidA, "have "+oidA, "")
	for _, step := range []struct {
		b     []byte
		paced bool
	}{
		{wants[:10], true}, {wants[10:], false},
		{haves[:1], true}, {haves[1 : len(haves)-2], true}, {haves[len(haves)-2:], false},
		{pkts("done")[:6], true}, {pkts("done")[6:], false},
		{pkts("have " + oidA), false}, // nothing after done
	} {
		feed(step.b)
		if paced() != step.paced {
			t.Fatalf("after %q: paced %v, want %v", step.b, paced(), step.paced)
		}
	}
}

// TestNegotiationPaceCutsOff: a stretch that falls behind is refused in
// git's framing and the request cancelled with ErrTooSlow.
func TestNegotiationPaceCutsOff(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	var client bytes.Buffer
	g := newNegotiationPace(nil, Pace{Max: 50 * time.Millisecond}, &client, cancel)
	g.feed([]byte("0032want"))
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a trickled want section was not cut off")
	}
	err := g.stop()
	if !errors.Is(context.Cause(ctx), ErrTooSlow) || err == nil || !strings.Contains(client.String(), "ERR request too slow: 8 bytes") {
		t.Fatalf("cause %v, refusal %v, client got %q", context.Cause(ctx), err, client.String())
	}
}
