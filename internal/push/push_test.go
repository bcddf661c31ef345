package push

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"packwire/internal/pktline"
)

const (
	zero = "0000000000000000000000000000000000000000"
	idA  = "1111111111111111111111111111111111111111"
	idB  = "2222222222222222222222222222222222222222"
)

func pkts(lines ...string) []byte {
	var b []byte
	for _, l := range lines {
		if l == "" {
			b = append(b, "0000"...)
			continue
		}
		b, _ = pktline.Append(b, []byte(l))
	}
	return b
}

func TestReadRequestAndEncode(t *testing.T) {
	in := pkts(
		"shallow "+idA,
		zero+" "+idA+" refs/heads/new\x00report-status-v2 side-band-64k push-options atomic agent=git/2.39",
		idA+" "+idB+" refs/heads/main\n",
		idB+" "+zero+" refs/heads/old",
		"",
		"ci.skip\n",
		"",
	)
	in = append(in, "PACKDATA"...)
	r := bytes.NewReader(in)
	req, err := ReadRequest(r, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(req.Commands) != 3 || !req.Commands[0].IsCreate() || !req.Commands[2].IsDelete() || req.Commands[1].Ref != "refs/heads/main" {
		t.Fatalf("commands: %+v", req.Commands)
	}
	if !req.HasCap("atomic") || !req.HasCap("agent") || req.HasCap("quiet") || req.Sideband() != 65515 || !req.Reports() {
		t.Fatalf("caps: %q", req.Caps)
	}
	if len(req.Options) != 1 || req.Options[0] != "ci.skip" || len(req.Shallow) != 1 {
		t.Fatalf("options/shallow: %+v", req)
	}
	rest, _ := io.ReadAll(r)
	if string(rest) != "PACKDATA" {
		t.Fatalf("read past the request: rest %q", rest)
	}
	// Dropping the first command moves the capabilities to the next one.
	enc := req.Encode(req.Commands[1:])
	again, err := ReadRequest(bytes.NewReader(enc), 0)
	if err != nil {
		t.Fatal(err)
	}
	if again.Caps != req.Caps || len(again.Commands) != 2 || again.Commands[0].Ref != "refs/heads/main" || len(again.Options) != 1 || len(again.Shallow) != 1 {
		t.Fatalf("re-encoded: %+v", again)
	}
}

func TestReadRequestErrors(t *testing.T) {
	if _, err := ReadRequest(bytes.NewReader(nil), 0); err != ErrNoCommands {
		t.Fatalf("EOF: %v", err)
	}
	if _, err := ReadRequest(bytes.NewReader([]byte("0000")), 0); err != ErrNoCommands {
		t.Fatalf("flush: %v", err)
	}
	for _, bad := range [][]byte{
		pkts("nonsense", ""),
		pkts(zero+" "+idA, ""), // no ref
		pkts(zero+" "+idA+" refs/heads/x y", ""),
		pkts(zero+" "+idA+"ab refs/heads/x", ""),
		pkts("push-cert\x00report-status", ""),
		pkts(zero + " " + idA + " refs/heads/x"), // cut short
		pkts(zero+" "+idA+" refs/heads/x\x00push-options", "", "opt"),
		pkts(zero+" "+idA+" refs/heads/x", idA+" "+idB+" refs/heads/y\x00caps", ""),
	} {
		if _, err := ReadRequest(bytes.NewReader(bad), 0); err == nil || err == ErrNoCommands {
			t.Errorf("accepted %q: %v", bad, err)
		}
	}
}

func TestRewrite(t *testing.T) {
	rw := &Rewrite{
		Refs:    []string{"refs/heads/a", "refs/heads/b", "refs/heads/c"},
		Refused: map[string]string{"refs/heads/b": "protected: delete denied"},
		Reason: func(ref, reason string) string {
			if ref == "refs/heads/c" && reason == "non-fast-forward" {
				return "protected: force-push denied"
			}
			return reason
		},
	}
	got := rw.Apply([]string{"unpack ok\n", "ok refs/heads/a\n", "option refname refs/heads/a\n", "ng refs/heads/c non-fast-forward\n"})
	want := []string{"unpack ok\n", "ok refs/heads/a\n", "option refname refs/heads/a\n", "ng refs/heads/b protected: delete denied\n", "ng refs/heads/c protected: force-push denied\n"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("got %q\nwant %q", got, want)
	}
}

// receivePackOutput frames a report the way receive-pack does.
func receivePackOutput(sideband int, progress string, lines ...string) []byte {
	var out []byte
	if sideband > 0 {
		out, _ = pktline.Append(out, append([]byte{2}, progress...))
		out = append(out, "0005\x01"...) // keepalive
	}
	return append(out, Encode(lines, sideband)...)
}

func TestReportWriter(t *testing.T) {
	rw := &Rewrite{Refs: []string{"refs/heads/a", "refs/heads/b"}, Refused: map[string]string{"refs/heads/b": "protected: create denied"}}
	for _, sb := range []int{0, 999, 65515} {
		in := receivePackOutput(sb, "Resolving deltas\n", "unpack ok\n", "ok refs/heads/a\n")
		// Written in every split, byte by byte included.
		for _, step := range []int{1, 3, 7, len(in)} {
			var out bytes.Buffer
			w := NewReportWriter(&out, sb, rw)
			for i := 0; i < len(in); i += step {
				w.Write(in[i:min(i+step, len(in))])
			}
			w.Finish()
			want := receivePackOutput(sb, "Resolving deltas\n", "unpack ok\n", "ok refs/heads/a\n", "ng refs/heads/b protected: create denied\n")
			if !bytes.Equal(out.Bytes(), want) {
				t.Fatalf("sideband %d step %d:\n got %q\nwant %q", sb, step, out.Bytes(), want)
			}
		}
	}
}

func TestReportWriterPassesGarbage(t *testing.T) {
	var out bytes.Buffer
	w := NewReportWriter(&out, 65515, &Rewrite{})
	w.Write([]byte("zzzz not pkt-lines"))
	w.Finish()
	if out.String() != "zzzz not pkt-lines" {
		t.Fatalf("got %q", out.String())
	}
}

func FuzzReadRequest(f *testing.F) {
	f.Add(pkts(zero+" "+idA+" refs/heads/new\x00report-status push-options", idA+" "+idB+" refs/heads/main", "", "opt", ""))
	f.Add(pkts("shallow "+idA, zero+" "+idA+" refs/heads/new", ""))
	f.Add([]byte("0000"))
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := ReadRequest(bytes.NewReader(data), 0)
		if err != nil {
			return
		}
		// Whatever parses must re-encode to something that parses the same.
		again, err := ReadRequest(bytes.NewReader(req.Encode(req.Commands)), 0)
		if err != nil {
			t.Fatalf("re-encoded request does not parse: %v", err)
		}
		if len(again.Commands) != len(req.Commands) || again.Caps != req.Caps || len(again.Options) != len(req.Options) {
			t.Fatalf("round trip changed the request: %+v vs %+v", req, again)
		}
	})
}

func FuzzReportWriter(f *testing.F) {
	f.Add(receivePackOutput(65515, "progress", "unpack ok\n", "ok refs/heads/a\n"), 65515, 5)
	f.Add(receivePackOutput(0, "", "unpack ok\n", "ng refs/heads/a non-fast-forward\n"), 0, 1)
	f.Fuzz(func(t *testing.T, data []byte, sideband int, step int) {
		if sideband < 0 || sideband > 65515 {
			sideband = 65515
		}
		if step <= 0 {
			step = 1
		}
		rw := &Rewrite{Refs: []string{"refs/heads/a", "refs/heads/b"}, Refused: map[string]string{"refs/heads/b": "no"},
			Reason: func(ref, reason string) string { return reason + "!" }}
		var out bytes.Buffer
		w := NewReportWriter(&out, sideband, rw)
		for i := 0; i < len(data); i += step {
			w.Write(data[i:min(i+step, len(data))])
		}
		w.Finish()
		// A report that was rewritten is well-formed pkt-lines throughout.
		if w.Sent() && sideband == 0 {
			r := pktline.NewReader(bytes.NewReader(out.Bytes()))
			for {
				_, _, err := r.Read()
				if err == io.EOF {
					break
				}
				if err != nil {
					return // garbage after the report is passed through as is
				}
			}
		}
	})
}
