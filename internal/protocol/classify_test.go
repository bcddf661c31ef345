package protocol

import (
	"strings"
	"testing"

	"packwire/internal/gitexec"
	"packwire/internal/pktline"
)

const oid = "0123456789abcdef0123456789abcdef01234567"

func pkts(lines ...string) []byte {
	var b []byte
	for _, l := range lines {
		switch l {
		case "0000", "0001", "0002":
			b = append(b, l...)
		default:
			b, _ = pktline.Append(b, []byte(l+"\n"))
		}
	}
	return b
}

func classify(t *testing.T, service gitexec.Service, v2, stateless bool, stream []byte) Summary {
	t.Helper()
	// Feed byte by byte too: pkt-lines split across writes must not matter.
	whole := NewClassifier(service, v2)
	whole.Write(stream)
	split := NewClassifier(service, v2)
	for i := range stream {
		split.Write(stream[i : i+1])
	}
	a, b := whole.Summary(false, stateless), split.Summary(false, stateless)
	if a.Kind != b.Kind || a.Wants != b.Wants || a.Haves != b.Haves {
		t.Fatalf("split writes changed the result: %+v vs %+v", a, b)
	}
	return a
}

func TestClassifyV0(t *testing.T) {
	want := "want " + oid + " multi_ack_detailed side-band-64k ofs-delta"
	cases := []struct {
		name      string
		stateless bool
		lines     []string
		kind      Kind
	}{
		{"full clone", false, []string{want, "want " + oid, "0000", "done"}, FullClone},
		{"shallow clone", false, []string{want, "deepen 1", "0000", "done"}, ShallowClone},
		{"partial clone", false, []string{want, "filter blob:none", "0000", "done"}, PartialClone},
		{"incremental fetch", false, []string{want, "0000", "have " + oid, "have " + oid, "done"}, IncrementalFetch},
		{"fetch into shallow", false, []string{want, "shallow " + oid, "0000", "have " + oid, "done"}, IncrementalFetch},
		{"shallow fetch", false, []string{want, "deepen 1", "0000", "have " + oid, "done"}, ShallowFetch},
		{"deepen-since", false, []string{want, "deepen-since 1700000000", "0000", "done"}, ShallowClone},
		{"no-op", false, []string{"0000"}, NoOp},
		{"negotiation round", true, []string{want, "0000", "have " + oid, "0000"}, Negotiation},
		{"stateless final", true, []string{want, "0000", "have " + oid, "done"}, IncrementalFetch},
		{"nothing sent", false, nil, Unknown},
	}
	for _, c := range cases {
		s := classify(t, gitexec.UploadPack, false, c.stateless, pkts(c.lines...))
		if s.Kind != c.kind {
			t.Errorf("%s: kind %s, want %s (%+v)", c.name, s.Kind, c.kind, s)
		}
	}
	s := classify(t, gitexec.UploadPack, false, false, pkts(want, "want "+oid, "deepen 3", "filter tree:0", "0000", "have "+oid, "done"))
	if s.Wants != 2 || s.Haves != 1 || s.Depth != 3 || s.Filter != "tree:0" || !s.Done {
		t.Errorf("fields: %+v", s)
	}
}

func TestClassifyV2(t *testing.T) {
	lsRefs := []string{"command=ls-refs", "agent=git/2.39", "0001", "peel", "ref-prefix HEAD", "0000"}
	fetch := func(args ...string) []string {
		return append(append([]string{"command=fetch", "agent=git/2.39", "object-format=sha1", "0001"}, args...), "0000")
	}
	cat := func(parts ...[]string) []string {
		var out []string
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	cases := []struct {
		name      string
		stateless bool
		lines     []string
		kind      Kind
	}{
		{"clone over a connection", false, cat(lsRefs, fetch("want "+oid, "done")), FullClone},
		{"shallow clone", false, cat(lsRefs, fetch("want "+oid, "deepen 1", "done")), ShallowClone},
		{"partial clone", false, cat(lsRefs, fetch("want "+oid, "filter blob:none", "done")), PartialClone},
		{"fetch", false, cat(lsRefs, fetch("want "+oid, "have "+oid, "done")), IncrementalFetch},
		{"shallow fetch", false, cat(lsRefs, fetch("want "+oid, "have "+oid, "deepen 1", "done")), ShallowFetch},
		{"ls-remote", false, lsRefs, NoOp},
		{"http ls-refs", true, lsRefs, Refs},
		{"http fetch round", true, fetch("want "+oid, "have "+oid), Negotiation},
		{"http fetch done", true, fetch("want "+oid, "have "+oid, "done"), IncrementalFetch},
		{"want-ref", false, fetch("want-ref refs/heads/main", "done"), FullClone},
	}
	for _, c := range cases {
		s := classify(t, gitexec.UploadPack, true, c.stateless, pkts(c.lines...))
		if s.Kind != c.kind {
			t.Errorf("%s: kind %s, want %s (%+v)", c.name, s.Kind, c.kind, s)
		}
	}
	// A stateless round the server answered with a pack ("ready") is a fetch.
	c := NewClassifier(gitexec.UploadPack, true)
	c.Write(pkts(fetch("want "+oid, "have "+oid)...))
	c.Response().Write(pkts("acknowledgments", "ACK "+oid, "ready", "0001", "packfile"))
	c.Response().Write([]byte("0009\x01PACK"))
	if s := c.Summary(false, true); s.Kind != IncrementalFetch {
		t.Errorf("ready round: %s", s.Kind)
	}
	c = NewClassifier(gitexec.UploadPack, true)
	c.Write(pkts(fetch("want "+oid, "have "+oid)...))
	c.Response().Write(pkts("acknowledgments", "NAK", "0000"))
	if s := c.Summary(false, true); s.Kind != Negotiation {
		t.Errorf("round without pack: %s", s.Kind)
	}
	// "have" in ls-refs arguments (it is not, but a ref-prefix could look odd) never counts.
	s := classify(t, gitexec.UploadPack, true, false, pkts("command=ls-refs", "0001", "ref-prefix have", "0000"))
	if s.Haves != 0 {
		t.Errorf("ls-refs argument counted as have: %+v", s)
	}
}

func TestClassifyPushStopsAtPack(t *testing.T) {
	stream := pkts(oid+" "+oid+" refs/heads/main\x00report-status side-band-64k", strings.Repeat("0", 40)+" "+oid+" refs/heads/new", "0000")
	stream = append(stream, "PACK\x00\x00\x00\x02garbage that is not pkt-lines at all"...)
	c := NewClassifier(gitexec.ReceivePack, false)
	c.Write(stream)
	if s := c.Summary(false, false); s.Kind != Push || s.PushedRefs != 2 {
		t.Fatalf("%+v", s)
	}
	if !c.stopped || c.buf != nil {
		t.Fatalf("classifier kept reading the pack")
	}
}

func TestClassifyArchiveAndAdvertisement(t *testing.T) {
	if s := classify(t, gitexec.UploadArchive, false, false, pkts("argument HEAD", "0000")); s.Kind != Archive {
		t.Errorf("archive: %s", s.Kind)
	}
	c := NewClassifier(gitexec.UploadPack, true)
	if s := c.Summary(true, true); s.Kind != Refs {
		t.Errorf("info/refs: %s", s.Kind)
	}
}

// FuzzClassifier: any byte stream, split anywhere, gives the same summary
// and never panics or buffers more than a pkt-line.
func FuzzClassifier(f *testing.F) {
	f.Add(pkts("want "+oid, "deepen 1", "0000", "done"), uint8(3), true)
	f.Add(pkts("command=fetch", "0001", "want "+oid, "filter blob:none", "done", "0000"), uint8(7), true)
	f.Fuzz(func(t *testing.T, stream []byte, cut uint8, v2 bool) {
		a := NewClassifier(gitexec.UploadPack, v2)
		a.Write(stream)
		b := NewClassifier(gitexec.UploadPack, v2)
		k := int(cut) % (len(stream) + 1)
		b.Write(stream[:k])
		b.Write(stream[k:])
		if len(a.buf) > maxBuffered || len(b.buf) > maxBuffered {
			t.Fatal("buffered more than a pkt-line")
		}
		sa, sb := a.Summary(false, true), b.Summary(false, true)
		if sa.Kind != sb.Kind || sa.Wants != sb.Wants || sa.Haves != sb.Haves || sa.Filter != sb.Filter {
			t.Fatalf("%+v != %+v", sa, sb)
		}
		if a.PackRequested() != b.PackRequested() {
			t.Fatalf("pack requested %v whole, %v split at %d", a.PackRequested(), b.PackRequested(), k)
		}
	})
}

func TestSettled(t *testing.T) {
	oid := "1111111111111111111111111111111111111111"
	c := NewClassifier(gitexec.UploadPack, true)
	if _, ok := c.Settled(false); ok {
		t.Fatal("a fetch was settled before the client said anything")
	}
	c.Write(pkts("command=fetch", "0001", "want "+oid, "deepen 1"))
	if kind, ok := c.Settled(false); ok {
		t.Fatalf("settled as %s before done", kind)
	}
	c.Write(pkts("done", "0000"))
	if kind, ok := c.Settled(false); !ok || kind != ShallowClone {
		t.Fatalf("after done: %s %v", kind, ok)
	}
	// A stateless round that has not said done may still be a negotiation.
	c = NewClassifier(gitexec.UploadPack, false)
	c.Write(pkts("want "+oid, "0000", "have "+oid))
	if _, ok := c.Settled(true); ok {
		t.Fatal("a negotiation round was settled")
	}
	for service, want := range map[gitexec.Service]Kind{gitexec.ReceivePack: Push, gitexec.UploadArchive: Archive} {
		if kind, ok := NewClassifier(service, false).Settled(false); !ok || kind != want {
			t.Errorf("%s: %s %v", service, kind, ok)
		}
	}
}

// feedSplit feeds stream to a fresh upload-pack classifier in pieces of n
// bytes and returns the offset after which it reported a pack request
// (-1: never).
func feedSplit(stream []byte, v2 bool, n int) int {
	c := NewClassifier(gitexec.UploadPack, v2)
	for i := 0; i < len(stream); i += n {
		end := min(i+n, len(stream))
		c.Write(stream[i:end])
		if c.PackRequested() {
			return end
		}
	}
	return -1
}

// TestPackRequested: what the admission of git:// and SSH sessions waits
// for, whatever the pieces the stream arrives in.
func TestPackRequested(t *testing.T) {
	lsRefs := pkts("command=ls-refs", "agent=git/2.39.5", "0001", "peel", "symrefs", "ref-prefix refs/heads/", "0000")
	fetch := pkts("command=fetch", "agent=git/2.39.5", "0001", "thin-pack", "want "+oid, "done", "0000")
	v0 := pkts("want "+oid+" multi_ack_detailed side-band-64k", "0000")
	both := append(append([]byte{}, lsRefs...), fetch...)
	for _, c := range []struct {
		name string
		v2   bool
		in   []byte
		want bool
	}{
		{"v2 ls-refs", true, lsRefs, false},
		{"v2 ls-refs then fetch", true, both, true},
		{"v0 wants", false, v0, true},
		{"v0 flush only (ls-remote)", false, []byte("0000"), false},
		{"a short line", false, pkts("done"), false},
		{"not pkt-lines", false, []byte("GET / HTTP/1.1\r\n"), true},
		{"length 3", false, []byte("0003"), true},
	} {
		for _, n := range []int{1, 2, 3, 5, 7, 64, 1 << 16} {
			if got := feedSplit(c.in, c.v2, n) >= 0; got != c.want {
				t.Errorf("%s in pieces of %d: pack request %v, want %v", c.name, n, got, c.want)
			}
		}
	}
	// It reports the fetch no later than its command line, before any want.
	if at, end := feedSplit(both, true, 1), len(lsRefs)+len(pkts("command=fetch")); at <= len(lsRefs) || at > end {
		t.Errorf("command=fetch reported at byte %d, want within its line (%d-%d]", at, len(lsRefs), end)
	}
}
