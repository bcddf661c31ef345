package pipeline

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// pktString is pkts as a string ("" a flush, as there; lines without "\n").
func pktString(lines ...string) string { return string(pkts(lines...)) }

// The have lines named are left out, each run asked about at the packet
// after it; everything else passes as it came, bytes that are not
// pkt-lines included, whatever the reads' sizes.
func TestHaveFilter(t *testing.T) {
	a, b, c := strings.Repeat("a", 40), strings.Repeat("b", 40), strings.Repeat("c", 40)
	in := pktString("want "+a+" multi_ack_detailed", "", "have "+a, "have "+b, "", "have "+c, "have "+b, "done") + "zzzz have " + b
	want := pktString("want "+a+" multi_ack_detailed", "", "have "+a, "", "have "+c, "done") + "zzzz have " + b
	var asked [][]string
	f := newHaveFilter(iotest.OneByteReader(strings.NewReader(in)), func(haves []string) map[string]bool {
		asked = append(asked, haves)
		return map[string]bool{b: true}
	})
	got, err := io.ReadAll(f)
	if err != nil || string(got) != want {
		t.Fatalf("got %q (%v), want %q", got, err, want)
	}
	if len(asked) != 2 || len(asked[0]) != 2 || len(asked[1]) != 2 {
		t.Fatalf("asked %v, want two runs of two", asked)
	}
}

// object-info leaves the advertisement, written in pieces of any size;
// what follows its flush passes untouched.
func TestCapabilityFilter(t *testing.T) {
	adv := pktString("version 2", "agent=git/2.39.5", "ls-refs=unborn", "fetch=shallow wait-for-done", "object-info", "object-format=sha1", "")
	rest := pktString("object-info", "")
	want := pktString("version 2", "agent=git/2.39.5", "ls-refs=unborn", "fetch=shallow wait-for-done", "object-format=sha1", "") + rest
	for _, size := range []int{1, 3, 7, 1000} {
		var out bytes.Buffer
		f := &capabilityFilter{w: &out, dropObjectInfo: true}
		all := adv + rest
		for i := 0; i < len(all); i += size {
			f.Write([]byte(all[i:min(i+size, len(all))]))
		}
		if out.String() != want {
			t.Fatalf("writes of %d: %q, want %q", size, out.String(), want)
		}
	}
}

// bundle-uri joins the advertisement just before its flush, object-info
// kept when it is served; what follows the flush passes untouched.
func TestCapabilityFilterAddsBundleURI(t *testing.T) {
	adv := pktString("version 2", "agent=git/2.39.5", "ls-refs=unborn", "object-info", "")
	rest := pktString("packfile", "")
	want := pktString("version 2", "agent=git/2.39.5", "ls-refs=unborn", "object-info", "bundle-uri", "") + rest
	for _, size := range []int{1, 5, 1000} {
		var out bytes.Buffer
		f := &capabilityFilter{w: &out, add: bundleCapability}
		all := adv + rest
		for i := 0; i < len(all); i += size {
			f.Write([]byte(all[i:min(i+size, len(all))]))
		}
		if out.String() != want {
			t.Fatalf("writes of %d: %q, want %q", size, out.String(), want)
		}
	}
}
