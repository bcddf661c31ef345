package fetchcache

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"packwire/internal/pktline"
)

// body frames lines as a v2 request: "|" is a delimiter, "" a flush.
func body(lines ...string) []byte {
	var b []byte
	for _, l := range lines {
		switch l {
		case "|":
			b = append(b, "0001"...)
		case "":
			b = append(b, "0000"...)
		default:
			b, _ = pktline.Append(b, []byte(l+"\n"))
		}
	}
	return b
}

const oid = "0123456789012345678901234567890123456789"

func TestCheck(t *testing.T) {
	clone := []string{"command=fetch", "agent=git/2.39.5", "object-format=sha1", "|", "thin-pack", "ofs-delta", "want " + oid, "want " + strings.Repeat("1", 40), "include-tag", "done", ""}
	cases := []struct {
		name string
		body []byte
		want error
	}{
		{"full clone", body(clone...), nil},
		{"shallow clone", body("command=fetch", "|", "want "+oid, "deepen 1", "done", ""), nil},
		{"filtered clone", body("command=fetch", "|", "want "+oid, "filter blob:none", "done", ""), nil},
		{"no capabilities", body("command=fetch", "|", "want "+oid, "done", ""), nil},
		{"without trailing newlines", []byte("0011command=fetch00010031want " + oid + "0008done0000"), nil},
		{"incremental", body("command=fetch", "|", "want "+oid, "have "+oid, "done", ""), nil},
		{"deepen-since", body("command=fetch", "|", "want "+oid, "deepen-since 1700000000", "done", ""), ErrDeepenBy},
		{"deepen-not", body("command=fetch", "|", "want "+oid, "deepen-not refs/heads/old", "done", ""), ErrDeepenBy},
		{"no haves, no done", body("command=fetch", "|", "want "+oid, ""), ErrNotDone},
		{"negotiation round", body("command=fetch", "|", "want "+oid, "have "+oid, ""), nil},
		{"wants nothing", body("command=fetch", "|", "done", ""), ErrNoWants},
		{"no arguments", body("command=fetch", ""), ErrNoWants},
		{"ls-refs", body("command=ls-refs", "|", "peel", ""), ErrNotFetch},
		{"empty", nil, ErrMalformed},
		{"no flush", body("command=fetch", "|", "want "+oid, "done"), ErrMalformed},
		{"trailing bytes", append(body("command=fetch", "|", "want "+oid, "done", ""), 'x'), ErrMalformed},
		{"two commands", append(body("command=fetch", "|", "want "+oid, "done", ""), body("command=fetch", "|", "want "+oid, "done", "")...), ErrMalformed},
		{"no command", body("agent=x", "|", "want "+oid, "done", ""), ErrMalformed},
		{"command twice", body("command=fetch", "command=fetch", "|", "want "+oid, "done", ""), ErrMalformed},
		{"two delimiters", body("command=fetch", "|", "want "+oid, "|", "done", ""), ErrMalformed},
		{"response-end", []byte("0011command=fetch0002"), ErrMalformed},
		{"bad length", []byte("00zzcommand=fetch"), ErrMalformed},
		{"length 3", []byte("0003"), ErrMalformed},
		{"cut short", []byte("0030command=fetch"), ErrMalformed},
		{"v0 request", body("want "+oid+" ofs-delta", "", "done"), ErrMalformed},
	}
	for _, c := range cases {
		if err := Check(c.body); !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("%s: Check = %v, want %v", c.name, err, c.want)
		}
	}
}

// FuzzCheck: Check never panics, and whatever it accepts is, read by the
// pkt-line reader on its own, exactly one fetch command with a want and
// done or a have, and nothing after its flush.
func FuzzCheck(f *testing.F) {
	f.Add(body("command=fetch", "agent=git/2.39.5", "|", "thin-pack", "want "+oid, "done", ""))
	f.Add(body("command=fetch", "|", "want "+oid, "have "+oid, "done", ""))
	f.Add(body("command=ls-refs", "|", "peel", ""))
	f.Add([]byte("0011command=fetch0001000ddone0000"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if Check(b) != nil {
			return
		}
		r := pktline.NewReader(bytes.NewReader(b))
		kind, line, err := r.Read()
		if err != nil || kind != pktline.Data || strings.TrimSuffix(string(line), "\n") != "command=fetch" {
			t.Fatalf("accepted %q: first packet %v %q %v", b, kind, line, err)
		}
		wants, haves, done, delims := 0, 0, false, 0
		for {
			kind, line, err := r.Read()
			if err != nil {
				t.Fatalf("accepted %q: %v", b, err)
			}
			if kind == pktline.Flush {
				break
			}
			if kind == pktline.Delim {
				delims++
				continue
			}
			if kind != pktline.Data {
				t.Fatalf("accepted %q with a %v packet", b, kind)
			}
			if delims == 0 {
				continue
			}
			word, _, _ := strings.Cut(strings.TrimSuffix(string(line), "\n"), " ")
			switch word {
			case "want", "want-ref":
				wants++
			case "have":
				haves++
			case "done":
				done = true
			case "deepen-since", "deepen-not":
				t.Fatalf("accepted %q with %q", b, line)
			}
		}
		if delims != 1 || wants == 0 || !done && haves == 0 {
			t.Fatalf("accepted %q: %d delimiters, %d wants, done %v", b, delims, wants, done)
		}
		if _, _, err := r.Read(); err != io.EOF {
			t.Fatalf("accepted %q with bytes after the flush", b)
		}
	})
}

// v0 frames lines as a v0/v1 request: "" is a flush.
func v0(lines ...string) []byte { return body(lines...) }

func TestInspectV0(t *testing.T) {
	first := "want " + oid + " multi_ack_detailed side-band-64k thin-pack ofs-delta agent=git/2.39.5"
	cases := []struct {
		name    string
		body    []byte
		want    error
		haves   int
		shallow bool
	}{
		{"clone", v0(first, "want "+strings.Repeat("1", 40), "", "done"), nil, 0, false},
		{"fetch with haves", v0(first, "", "have "+oid, "have "+oid, "done"), nil, 2, false},
		{"shallow clone", v0(first, "deepen 1", "", "done"), nil, 0, true},
		{"shallow repository", v0(first, "shallow "+oid, "", "have "+oid, "done"), nil, 1, true},
		{"filtered clone", v0(first, "filter blob:none", "", "done"), nil, 0, false},
		{"deepen-since", v0(first, "deepen-since 1700000000", "", "done"), ErrDeepenBy, 0, false},
		{"negotiation round", v0(first, "", "have "+oid, ""), nil, 1, false},
		{"round of nothing", v0(first, "", ""), ErrNotDone, 0, false},
		{"round then done", v0(first, "", "have "+oid, "", "have "+oid, "done"), ErrNotDone, 0, false},
		{"wants only", v0(first, ""), ErrNotDone, 0, false},
		{"ls-remote", v0(""), ErrNoWants, 0, false},
		{"bytes after done", append(v0(first, "", "done"), "0000"...), ErrMalformed, 0, false},
		{"have before flush", v0(first, "have "+oid, "", "done"), ErrMalformed, 0, false},
		{"v2 command", body("command=fetch", "|", "want "+oid, "done", ""), ErrMalformed, 0, false},
		{"delimiter", v0(first, "|", "done"), ErrMalformed, 0, false},
	}
	for _, c := range cases {
		req, err := Inspect(c.body, false)
		if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("%s: Inspect = %v, want %v", c.name, err, c.want)
			continue
		}
		if err == nil && (req.Haves != c.haves || req.Shallow != c.shallow) {
			t.Errorf("%s: haves %d shallow %v, want %d %v", c.name, req.Haves, req.Shallow, c.haves, c.shallow)
		}
	}
}

// TestKeyWithoutAgent: requests that differ only in the client's agent
// have one key; any other difference (a capability, the order of the
// haves) makes another.
func TestKeyWithoutAgent(t *testing.T) {
	other := strings.Repeat("2", 40)
	key := func(b []byte, v2 bool) string {
		t.Helper()
		req, err := Inspect(b, v2)
		if err != nil {
			t.Fatal(err)
		}
		return string(req.Key)
	}
	v2req := func(agent string, haves ...string) []byte {
		lines := []string{"command=fetch", "agent=" + agent, "object-format=sha1", "|", "ofs-delta", "want " + oid}
		for _, h := range haves {
			lines = append(lines, "have "+h)
		}
		return body(append(lines, "done", "")...)
	}
	v0req := func(caps string, haves ...string) []byte {
		lines := []string{"want " + oid + " " + caps, ""}
		for _, h := range haves {
			lines = append(lines, "have "+h)
		}
		return v0(append(lines, "done")...)
	}
	if key(v2req("git/2.39.5", oid, other), true) != key(v2req("git/2.45.0", oid, other), true) {
		t.Error("v2: the agent changes the key")
	}
	if key(v2req("git/2.39.5", oid, other), true) == key(v2req("git/2.39.5", other, oid), true) {
		t.Error("v2: the order of the haves does not change the key")
	}
	if key(v0req("ofs-delta agent=git/2.39.5 side-band-64k", oid), false) != key(v0req("ofs-delta side-band-64k agent=git/2.45.0", oid), false) {
		t.Error("v0: the agent changes the key")
	}
	if key(v0req("ofs-delta side-band-64k", oid), false) == key(v0req("ofs-delta side-band", oid), false) {
		t.Error("v0: a capability does not change the key")
	}
	if key(v0req("ofs-delta", oid, other), false) == key(v0req("ofs-delta", other, oid), false) {
		t.Error("v0: the order of the haves does not change the key")
	}
}
