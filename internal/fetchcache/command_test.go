package fetchcache

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"packwire/internal/pktline"
)

func TestInspectCommand(t *testing.T) {
	lsRefs := body("command=ls-refs", "agent=git/2.39.5", "object-format=sha1", "|", "peel", "symrefs", "unborn", "ref-prefix HEAD", "ref-prefix refs/heads/", "")
	cmd, err := InspectCommand(lsRefs)
	if err != nil || cmd.Name != "ls-refs" {
		t.Fatalf("ls-refs: %+v %v", cmd, err)
	}
	other := body("command=ls-refs", "agent=git/2.45.0", "object-format=sha1", "|", "peel", "symrefs", "unborn", "ref-prefix HEAD", "ref-prefix refs/heads/", "")
	if cmd2, _ := InspectCommand(other); !bytes.Equal(cmd.Key, cmd2.Key) {
		t.Fatalf("the agent changes the key:\n%q\n%q", cmd.Key, cmd2.Key)
	}
	if bytes.Contains(cmd.Key, []byte("agent=")) {
		t.Fatalf("key keeps the agent: %q", cmd.Key)
	}
	for _, differs := range [][]byte{
		body("command=ls-refs", "object-format=sha1", "|", "peel", "symrefs", "unborn", "ref-prefix HEAD", ""),
		body("command=ls-refs", "object-format=sha1", "|", "symrefs", "peel", "unborn", "ref-prefix HEAD", "ref-prefix refs/heads/", ""),
		body("command=ls-refs", "object-format=sha256", "|", "peel", "symrefs", "unborn", "ref-prefix HEAD", "ref-prefix refs/heads/", ""),
		body("command=ls-refs", "object-format=sha1", "server-option=x", "|", "peel", "symrefs", "unborn", "ref-prefix HEAD", "ref-prefix refs/heads/", ""),
	} {
		if c, err := InspectCommand(differs); err != nil || bytes.Equal(c.Key, cmd.Key) {
			t.Fatalf("%q: key %q, err %v: should differ from %q", differs, c.Key, err, cmd.Key)
		}
	}
	if c, err := InspectCommand(body("command=ls-refs", "")); err != nil || c.Name != "ls-refs" {
		t.Fatalf("bare ls-refs: %+v %v", c, err)
	}
	for name, b := range map[string][]byte{
		"empty":         nil,
		"flush alone":   []byte("0000"),
		"no flush":      body("command=ls-refs", "|", "peel"),
		"trailing":      append(body("command=ls-refs", ""), 'x'),
		"two commands":  append(body("command=ls-refs", ""), body("command=ls-refs", "")...),
		"no command":    body("agent=x", "|", "peel", ""),
		"empty name":    body("command=", ""),
		"command twice": body("command=ls-refs", "command=fetch", ""),
		"two delims":    body("command=ls-refs", "|", "peel", "|", ""),
		"delim first":   []byte("00010000"),
		"response-end":  []byte("0013command=ls-refs0002"),
		"bad length":    []byte("00zzcommand=ls-refs"),
		"cut short":     []byte("0030command=ls-refs"),
	} {
		if _, err := InspectCommand(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err %v, want ErrMalformed", name, err)
		}
	}
}

// FuzzInspectCommand: never panics, and what it accepts is, read by the
// pkt-line reader on its own, one command packet first and a flush last
// with nothing after it; the key is the body without agent= capabilities.
func FuzzInspectCommand(f *testing.F) {
	f.Add(body("command=ls-refs", "agent=git/2.39.5", "|", "peel", "ref-prefix HEAD", ""))
	f.Add(body("command=fetch", "|", "want "+oid, "done", ""))
	f.Add([]byte("0014command=ls-refs0000"))
	f.Fuzz(func(t *testing.T, b []byte) {
		cmd, err := InspectCommand(b)
		if err != nil {
			return
		}
		r := pktline.NewReader(bytes.NewReader(b))
		kind, line, err := r.Read()
		if err != nil || kind != pktline.Data || strings.TrimSuffix(string(line), "\n") != "command="+cmd.Name {
			t.Fatalf("accepted %q: first packet %v %q %v", b, kind, line, err)
		}
		rebuilt, _ := pktline.Append(nil, line)
		inArguments := false
		for {
			kind, line, err := r.Read()
			if err != nil {
				t.Fatalf("accepted %q: %v", b, err)
			}
			switch kind {
			case pktline.Flush:
				rebuilt = append(rebuilt, "0000"...)
				// Lengths may be sent in upper case; the key keeps them as sent.
				if !bytes.EqualFold(rebuilt, cmd.Key) || len(rebuilt) != len(cmd.Key) {
					t.Fatalf("accepted %q: key %q, want %q", b, cmd.Key, rebuilt)
				}
				if _, _, err := r.Read(); err == nil {
					t.Fatalf("accepted %q with bytes after the flush", b)
				}
				return
			case pktline.Delim:
				rebuilt = append(rebuilt, "0001"...)
				inArguments = true
			case pktline.Data:
				if bytes.HasPrefix(line, []byte("command=")) && !inArguments {
					t.Fatalf("accepted %q with a second command line", b)
				}
				if !bytes.HasPrefix(line, []byte("agent=")) || inArguments {
					rebuilt, _ = pktline.Append(rebuilt, line)
				}
			default:
				t.Fatalf("accepted %q with packet kind %v", b, kind)
			}
		}
	})
}
