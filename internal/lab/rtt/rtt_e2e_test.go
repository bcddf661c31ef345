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
	rows := client.Measure(context.Background(), targets, plan, nil)
	get := func(transport, op string, proto int, reuse Reuse) Row {
		t.Helper()
		for _, r := range rows {
			if r.Transport == transport && r.Op == op && r.Protocol == proto && r.Reuse == reuse {
				return r
			}
		}
		t.Fatalf("no row for %s %s v%d %s", transport, op, proto, reuse)
		return Row{}
	}
	for _, r := range rows {
		t.Logf("%-7s %-16s v%d %-13s conns %d round trips %d-%d, walls %v", r.Transport, r.Op, r.Protocol, r.Reuse, r.Conns, r.RoundTrips, r.RoundTripsMax, r.Points)
		if r.Error != "" {
			t.Errorf("%s %s v%d %s: %s", r.URL, r.Op, r.Protocol, r.Reuse, r.Error)
			continue
		}
		if len(r.Points) != 2 {
			t.Errorf("%s %s v%d %s: %d points, want 2", r.Transport, r.Op, r.Protocol, r.Reuse, len(r.Points))
			continue
		}
		// Every round trip the proxy counts waits a whole added RTT: the
		// wall at 20 ms cannot be shorter (a little slack for the counting
		// of both sides talking at once in SSH's key exchange).
		if min := time.Duration(r.RoundTrips) * delay * 3 / 4; r.Points[1].Wall < min {
			t.Errorf("%s %s v%d %s: %v at %v for %d round trips, want at least %v", r.Transport, r.Op, r.Protocol, r.Reuse, r.Points[1].Wall, delay, r.RoundTrips, min)
		}
		if r.Reuse == ReuseControlMaster && r.Conns != 0 {
			t.Errorf("%s %s v%d over a master connection opened %d connections", r.Transport, r.Op, r.Protocol, r.Conns)
		}
		httpFresh := r.Transport == HTTP && r.Reuse == ReuseNone
		if r.Reuse != ReuseControlMaster && !httpFresh && r.Conns != 1 {
			t.Errorf("%s %s v%d %s opened %d connections, want 1", r.Transport, r.Op, r.Protocol, r.Reuse, r.Conns)
		}
	}
	// Over HTTP without keep-alive every request opens its own connection:
	// v2's ls-remote (a GET and a POST) then pays one more connect.
	for _, proto := range plan.Protocols {
		kept, fresh := get(HTTP, LsRemote.Name, proto, ReuseKeepAlive), get(HTTP, LsRemote.Name, proto, ReuseNone)
		requests := 1 + proto/2 // v0: the GET; v2: GET + POST ls-refs
		if kept.Conns != 1 || fresh.Conns != requests || fresh.RoundTrips != kept.RoundTrips+requests-1 {
			t.Errorf("http v%d ls-remote: kept alive %d connection(s), %d round trips; without reuse %d connection(s), %d round trips; want 1 and %d connections",
				proto, kept.Conns, kept.RoundTrips, fresh.Conns, fresh.RoundTrips, requests)
		}
	}
	// What the protocols say: v0 answers ls-remote with the advertisement
	// right after the connect; v2 sends capabilities first, then the refs
	// when asked (on HTTP: a GET and a POST on one kept-alive connection).
	for _, tr := range []string{Git, HTTP} {
		if r := get(tr, LsRemote.Name, 0, ReusesFor(tr)[0]); r.RoundTrips != 2 || r.RoundTripsMax != 2 {
			t.Errorf("%s v0 ls-remote: %d-%d round trips, want 2", tr, r.RoundTrips, r.RoundTripsMax)
		}
		if r := get(tr, LsRemote.Name, 2, ReusesFor(tr)[0]); r.RoundTrips != 3 || r.RoundTripsMax != 3 {
			t.Errorf("%s v2 ls-remote: %d-%d round trips, want 3", tr, r.RoundTrips, r.RoundTripsMax)
		}
	}
	// A master connection skips the SSH handshake's round trips.
	for _, op := range plan.Ops {
		for _, proto := range plan.Protocols {
			fresh, reused := get(SSH, op.Name, proto, ReuseNone), get(SSH, op.Name, proto, ReuseControlMaster)
			if reused.RoundTripsMax >= fresh.RoundTrips {
				t.Errorf("ssh %s v%d: %d round trips on a master connection, %d on a new one", op.Name, proto, reused.RoundTripsMax, fresh.RoundTrips)
			}
		}
	}
}
