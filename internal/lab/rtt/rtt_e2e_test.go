package rtt

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"packwire/internal/gittest"
	"packwire/internal/servertest"
)

// TestThroughPackwire measures ls-remote, a no-op fetch and a shallow
// clone over git://, HTTP and SSH (with and without a master connection)
// against an in-process packwire, at no added delay and at 20 ms.
func TestThroughPackwire(t *testing.T) {
	if _, err := exec.LookPath("ssh"); err != nil {
		t.Fatal("ssh is not installed: run scripts/install-deps")
	}
	srv := servertest.Start(t, nil)
	srv.Repo(t, "team/app", gittest.Shape{Commits: 5, Files: 10, Branches: 1, Tags: 1, Seed: 1})
	client := &Client{Env: srv.Env.Vars, SSHKey: srv.SSHKey, Dir: t.TempDir()}
	var targets []Target
	for _, u := range []string{srv.GitURL("team/app"), srv.HTTPURL("team/app"), srv.SSHURL("team/app")} {
		tg, err := ParseURL(u)
		if err != nil {
			t.Fatal(err)
		}
		client.ResolveSSH(context.Background(), &tg)
		targets = append(targets, tg)
	}
	const delay = 20 * time.Millisecond
	plan := Plan{Delays: []time.Duration{0, delay}, Protocols: []int{0, 2}, Ops: []Op{LsRemote, NoopFetch, SmallClone}}
	rows := client.Measure(context.Background(), targets, plan, func(s string) { t.Log(s) })
	for _, r := range rows {
		t.Logf("%-40s %-16s v%d %-13s conns %d rt %d-%d fit %v + %.2f x RTT", r.URL, r.Op, r.Protocol, r.Reuse, r.Conns, r.RoundTrips, r.RoundTripsMax, r.Fit.Base, r.Fit.PerRTT)
		if r.Error != "" {
			t.Errorf("%s %s v%d %s: %s", r.URL, r.Op, r.Protocol, r.Reuse, r.Error)
		}
	}
}
