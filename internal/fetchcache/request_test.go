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
		{"incremental", body("command=fetch", "|", "want "+oid, "have "+oid, "done", ""), ErrHaves},
		{"deepen-since", body("command=fetch", "|", "want "+oid, "deepen-since 1700000000", "done", ""), ErrDeepenBy},
		{"deepen-not", body("command=fetch", "|", "want "+oid, "deepen-not refs/heads/old", "done", ""), ErrDeepenBy},
		{"negotiation round", body("command=fetch", "|", "want "+oid, ""), ErrNotDone},
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
// done, no have, and nothing after its flush.
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
		wants, done, delims := 0, false, 0
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
			case "done":
				done = true
			case "have", "deepen-since", "deepen-not":
				t.Fatalf("accepted %q with %q", b, line)
			}
		}
		if delims != 1 || wants == 0 || !done {
			t.Fatalf("accepted %q: %d delimiters, %d wants, done %v", b, delims, wants, done)
		}
		if _, _, err := r.Read(); err != io.EOF {
			t.Fatalf("accepted %q with bytes after the flush", b)
		}
	})
}
