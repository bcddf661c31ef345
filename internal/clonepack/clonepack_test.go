package clonepack

import (
	"bytes"
	"crypto/rand"
	"crypto/sha1"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"packwire/internal/pktline"
)

const (
	idA = "1111111111111111111111111111111111111111"
	idB = "2222222222222222222222222222222222222222"
)

func pkts(lines ...string) []byte {
	var b []byte
	for _, l := range lines {
		switch l {
		case "0000":
			b = append(b, "0000"...)
		case "0001":
			b = append(b, "0001"...)
		default:
			b, _ = pktline.Append(b, []byte(l+"\n"))
		}
	}
	return b
}

// TestParse: only a plain full clone is taken; anything that changes the
// objects or the framing git would send is left to git.
func TestParse(t *testing.T) {
	v2 := func(args ...string) []byte {
		return pkts(append(append([]string{"command=fetch", "agent=git/2.39.5", "object-format=sha1", "0001"}, args...), "0000")...)
	}
	v0 := func(caps string, rest ...string) []byte {
		return pkts(append([]string{"want " + idA + " " + caps, "want " + idB, "want " + idA}, rest...)...)
	}
	const caps = "multi_ack_detailed no-done side-band-64k thin-pack include-tag ofs-delta agent=git/2.39.5"
	for _, tc := range []struct {
		name string
		body []byte
		v2   bool
		band int // 0: not taken
	}{
		{"v2 clone", v2("thin-pack", "no-progress", "include-tag", "ofs-delta", "want "+idA, "want "+idB, "done"), true, 65520},
		{"v2 without ofs-delta", v2("want "+idA, "done"), true, 0},
		{"v2 with a have", v2("ofs-delta", "want "+idA, "have "+idB, "done"), true, 0},
		{"v2 without done", v2("ofs-delta", "want "+idA), true, 0},
		{"v2 shallow", v2("ofs-delta", "want "+idA, "deepen 1", "done"), true, 0},
		{"v2 filter", v2("ofs-delta", "want "+idA, "filter blob:none", "done"), true, 0},
		{"v2 want-ref", v2("ofs-delta", "want-ref refs/heads/main", "done"), true, 0},
		{"v2 sideband-all", v2("ofs-delta", "sideband-all", "want "+idA, "done"), true, 0},
		{"v2 ls-refs", pkts("command=ls-refs", "0001", "peel", "0000"), true, 0},
		{"v0 clone", v0(caps, "0000", "done"), false, 65520},
		{"v0 small band", v0(strings.Replace(caps, "side-band-64k", "side-band", 1), "0000", "done"), false, 1000},
		{"v0 no band", v0(strings.Replace(caps, "side-band-64k ", "", 1), "0000", "done"), false, 0},
		{"v0 no ofs-delta", v0(strings.Replace(caps, " ofs-delta", "", 1), "0000", "done"), false, 0},
		{"v0 with a have", v0(caps, "0000", "have "+idB, "done"), false, 0},
		{"v0 shallow", v0(caps, "deepen 1", "0000", "done"), false, 0},
		{"v0 filter", v0(caps, "filter blob:none", "0000", "done"), false, 0},
		{"v0 a round", v0(caps, "0000"), false, 0},
		{"v0 after done", v0(caps, "0000", "done", "done"), false, 0},
	} {
		c, err := Parse(tc.body, tc.v2)
		switch {
		case tc.band == 0 && !errors.Is(err, ErrNotClone):
			t.Errorf("%s: taken (%+v)", tc.name, c)
		case tc.band != 0 && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.band != 0 && (c.Band != tc.band || strings.Join(c.Wants, ",") != idA+","+idB):
			t.Errorf("%s: %+v", tc.name, c)
		}
	}
}

// fakePack writes a file shaped like a pack (header, body, trailer) in a
// directory and returns it opened and its checksum.
func fakePack(t *testing.T, body int) (*os.File, []byte) {
	t.Helper()
	b := make([]byte, 12+body)
	copy(b, "PACK\x00\x00\x00\x02\x00\x00\x00\x01")
	rand.Read(b[12:])
	sum := sha1.Sum(b)
	b = append(b, sum[:]...)
	path := filepath.Join(t.TempDir(), "pack")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, sum[:]
}

// TestWriteResponse: the pack goes out whole, in band-1 packets no longer
// than the client's band, after git's first line, and ends with a flush.
func TestWriteResponse(t *testing.T) {
	for _, tc := range []struct {
		c     Clone
		first string
		body  int
	}{
		{Clone{V2: true, Band: 65520}, "packfile\n", 3<<20 + 12345},
		{Clone{Band: 65520}, "NAK\n", 100},
		{Clone{Band: 1000}, "NAK\n", 70000},
	} {
		f, sum := fakePack(t, tc.body)
		p, err := check(f, sum)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		n, err := p.WriteResponse(&out, tc.c)
		if err != nil || n != int64(out.Len()) {
			t.Fatalf("wrote %d of %d: %v", n, out.Len(), err)
		}
		r := pktline.NewReader(&out)
		kind, line, err := r.Read()
		if err != nil || kind != pktline.Data || string(line) != tc.first {
			t.Fatalf("first packet %q %v", line, err)
		}
		var pack []byte
		for {
			raw := out.Bytes()
			kind, line, err := r.Read()
			if err != nil {
				t.Fatalf("no flush at the end: %v", err)
			}
			if kind == pktline.Flush {
				break
			}
			if n, _ := pktline.ParseLength(raw[:4]); n > tc.c.Band || line[0] != 1 {
				t.Fatalf("packet of %d bytes on band %d; the client's band is %d", n, line[0], tc.c.Band)
			}
			pack = append(pack, line[1:]...)
		}
		if _, _, err := r.Read(); err != io.EOF {
			t.Fatalf("bytes after the flush: %v", err)
		}
		want, _ := os.ReadFile(f.Name())
		if !bytes.Equal(pack, want) {
			t.Fatalf("the side band carried %d bytes, not the pack's %d", len(pack), len(want))
		}
	}
}

// TestCheck: a file whose trailer is not the checksum it is named after
// (replaced under the same name, or not a pack) is not served.
func TestCheck(t *testing.T) {
	f, sum := fakePack(t, 1000)
	other := bytes.Clone(sum)
	other[0] ^= 1
	if _, err := check(f, other); !errors.Is(err, ErrNotClone) {
		t.Fatalf("a pack with another checksum was taken: %v", err)
	}
	if _, err := check(f, sum); err != nil {
		t.Fatal(err)
	}
}
