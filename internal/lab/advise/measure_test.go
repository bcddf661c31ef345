package advise

import (
	"context"
	"strings"
	"testing"

	"packwire/internal/gittest"
	"packwire/internal/lab/rtt"
	"packwire/internal/servertest"
)

// TestMeasurePackwire measures an in-process packwire over all three
// transports and checks the measurements hang together.
func TestMeasurePackwire(t *testing.T) {
	srv := servertest.Start(t, nil)
	srv.Repo(t, "team/app", gittest.Shape{Commits: 20, Files: 30, BlobBytes: 3000, Seed: 2})
	o := Options{Client: &rtt.Client{Env: srv.Env.Vars, SSHKey: srv.SSHKey, Dir: t.TempDir()}, Runs: 1}
	urls := []string{srv.GitURL("team/app"), srv.HTTPURL("team/app"), srv.SSHURL("team/app"), "git://127.0.0.1:1/team/app"}
	m, err := Measure(context.Background(), urls, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Targets) != 4 || m.Targets[3].Error == "" || !strings.Contains(m.Targets[3].Error, "cannot connect") {
		t.Errorf("targets %+v: want the closed port reported", m.Targets)
	}
	// 3 URLs x protocols 0 and 2 x ls-remote and fetch, SSH and HTTP
	// twice (with and without connection reuse).
	if len(m.Ops) != 5*4 {
		t.Errorf("%d operations measured, want 20", len(m.Ops))
	}
	for _, op := range m.Ops {
		if op.Error != "" || op.Wall <= 0 || op.RoundTrips < 2 && op.Reuse != rtt.ReuseControlMaster {
			t.Errorf("operation %+v", op)
		}
	}
	if len(m.Clones) != len(CloneVariants) {
		t.Fatalf("clones %+v", m.Clones)
	}
	sizes := map[string]int64{}
	for _, c := range m.Clones {
		if c.Error != "" {
			t.Errorf("clone %s: %s", c.Variant, c.Error)
		}
		sizes[c.Variant] = c.BytesDown
	}
	// A shallow clone carries one commit's objects, a blobless clone none of
	// the blobs: both smaller than the full clone. The partial clones'
	// checkouts fetch what they lack; a full clone's checkout fetches nothing.
	if sizes[CloneShallow] >= sizes[CloneFull] || sizes[CloneBlobless] >= sizes[CloneFull] || sizes[CloneTreeless] > sizes[CloneBlobless] {
		t.Errorf("clone sizes %v", sizes)
	}
	checkouts := map[string]int64{}
	for _, c := range m.Clones {
		// (The sparse clone's checkout has only top-level files, and this
		// shape has none: it may fetch nothing.)
		partial := c.Variant == CloneBlobless || c.Variant == CloneTreeless
		if c.Variant != CloneSparse && partial != (c.CheckoutBytes > 0) {
			t.Errorf("%s clone's checkout fetched %d bytes", c.Variant, c.CheckoutBytes)
		}
		checkouts[c.Variant] = c.CheckoutBytes
	}
	// A sparse checkout (top-level files only) fetches less than a whole one.
	if checkouts[CloneSparse] >= checkouts[CloneBlobless] {
		t.Errorf("the sparse clone's checkout fetched %d bytes, the blobless one's %d", checkouts[CloneSparse], checkouts[CloneBlobless])
	}
	advice, err := Recommend(m, UseCI)
	if err != nil {
		t.Fatal(err)
	}
	if len(advice) < 5 {
		t.Errorf("advice %+v", advice)
	}
}

// TestMeasureBrokenURL: a URL whose port answers but whose first command
// fails (no such repository) is reported as not working, its operations
// carry the error, and the advice comes from the URL that works.
func TestMeasureBrokenURL(t *testing.T) {
	srv := servertest.Start(t, nil)
	srv.Repo(t, "team/app", gittest.Shape{Commits: 5, Files: 10, BlobBytes: 1000, Seed: 4})
	o := Options{Client: &rtt.Client{Env: srv.Env.Vars, Dir: t.TempDir()}, Runs: 1, NoClones: true}
	good, bad := srv.HTTPURL("team/app"), srv.HTTPURL("team/missing")
	m, err := Measure(context.Background(), []string{good, bad}, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Targets) != 2 || m.Targets[0].Error != "" || m.Targets[1].Error == "" {
		t.Fatalf("targets %+v: want the missing repository's URL, and only it, not working", m.Targets)
	}
	// 2 URLs x protocols 0 and 2 x ls-remote and fetch x kept alive or not.
	if len(m.Ops) != 2*4*2 {
		t.Fatalf("%d operations, want 16: %+v", len(m.Ops), m.Ops)
	}
	for _, op := range m.Ops {
		if (op.URL == bad) != (op.Error != "") || op.Error == "" && (op.Wall <= 0 || op.RoundTrips < 2) {
			t.Errorf("operation %+v", op)
		}
		if op.Op != rtt.KindLsRemote && op.Op != rtt.KindFetch {
			t.Errorf("operation kind %q", op.Op)
		}
	}
	advice, err := Recommend(m, UseDev)
	if err != nil {
		t.Fatal(err)
	}
	if tr := advice[0]; tr.Topic != "transport" || !strings.Contains(tr.Text, "fetch from "+good+" (the only URL that worked)") || !strings.Contains(tr.Evidence, bad+" did not work: ") {
		t.Errorf("transport advice %+v", tr)
	}
}
