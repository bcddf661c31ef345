package pipeline

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"packwire/internal/pktline"
)

func pkts(lines ...string) []byte {
	var b bytes.Buffer
	for _, l := range lines {
		switch l {
		case "0000", "0001", "0002":
			b.WriteString(l)
		default:
			pktline.Write(&b, []byte(l))
		}
	}
	return b.Bytes()
}

// feedSplit feeds b to a fresh scanner in pieces of n bytes and returns
// the offset after which it reported a pack request (-1: never).
func feedSplit(b []byte, n int) int {
	var s pktScan
	for i := 0; i < len(b); i += n {
		end := min(i+n, len(b))
		if s.feed(b[i:end]) {
			return end
		}
	}
	return -1
}

func TestPktScan(t *testing.T) {
	lsRefs := pkts("command=ls-refs\n", "agent=git/2.39.5\n", "0001", "peel\n", "symrefs\n", "ref-prefix refs/heads/\n", "0000")
	fetch := pkts("command=fetch\n", "agent=git/2.39.5\n", "0001", "thin-pack\n", "want 0123456789012345678901234567890123456789\n", "done\n", "0000")
	v0 := pkts("want 0123456789012345678901234567890123456789 multi_ack_detailed side-band-64k\n", "0000")
	for _, c := range []struct {
		name string
		in   []byte
		want bool
	}{
		{"v2 ls-refs", lsRefs, false},
		{"v2 ls-refs then fetch", append(append([]byte{}, lsRefs...), fetch...), true},
		{"v0 wants", v0, true},
		{"v0 flush only (ls-remote)", []byte("0000"), false},
		{"a short line", pkts("done\n"), false},
		{"not pkt-lines", []byte("GET / HTTP/1.1\r\n"), true},
		{"length 3", []byte("0003"), true},
	} {
		for _, n := range []int{1, 2, 3, 5, 7, 64, 1 << 16} {
			if got := feedSplit(c.in, n) >= 0; got != c.want {
				t.Errorf("%s in pieces of %d: pack request %v, want %v", c.name, n, got, c.want)
			}
		}
	}
	// It reports the fetch no later than its command line, before any want.
	both := append(append([]byte{}, lsRefs...), fetch...)
	if at, end := feedSplit(both, 1), len(lsRefs)+len(pkts("command=fetch\n")); at <= len(lsRefs) || at > end {
		t.Errorf("command=fetch reported at byte %d, want within its line (%d-%d]", at, len(lsRefs), end)
	}
}

// FuzzPktScan: any split of the stream gives the same answer as the whole.
func FuzzPktScan(f *testing.F) {
	f.Add(pkts("command=ls-refs\n", "0000"), uint8(1))
	f.Add(pkts("want 0123456789012345678901234567890123456789\n", "0000"), uint8(3))
	f.Add([]byte("0004000"), uint8(2))
	f.Fuzz(func(t *testing.T, b []byte, n uint8) {
		whole := feedSplit(b, len(b)+1) >= 0
		if split := feedSplit(b, int(n)%17+1) >= 0; split != whole {
			t.Fatalf("split by %d: %v, whole: %v", int(n)%17+1, split, whole)
		}
	})
}

// TestAdmissionGateRefuses: a refused session gets git's ERR line, git's
// stdin ends before the want, and git's stderr goes quiet.
func TestAdmissionGateRefuses(t *testing.T) {
	busy := &Error{Code: CodeUnavailable, Message: "server busy: waited 1s in the queue for team/app; retry in 1s"}
	in := io.MultiReader(bytes.NewReader(pkts("command=ls-refs\n", "0000")), bytes.NewReader(pkts("command=fetch\n", "0000")))
	var client bytes.Buffer
	admits := 0
	g := newAdmissionGate(in, func() error { admits++; return busy }, &client)
	passed, err := io.ReadAll(g)
	if !errors.Is(err, busy) || g.Refusal() != busy || admits != 1 {
		t.Fatalf("err %v, refusal %v, %d admissions", err, g.Refusal(), admits)
	}
	if strings.Contains(string(passed), "command=fetch") || !strings.Contains(string(passed), "command=ls-refs") {
		t.Fatalf("git was given %q", passed)
	}
	if want := "ERR " + busy.Message; !strings.Contains(client.String(), want) {
		t.Fatalf("client got %q, want an ERR pkt-line %q", client.String(), want)
	}
	var stderr bytes.Buffer
	q := quietAfterRefusal{w: &stderr, refused: g.refusedC}
	q.Write([]byte("fatal: the remote end hung up unexpectedly\n"))
	if stderr.Len() != 0 {
		t.Fatalf("git's stderr after a refusal: %q", stderr.String())
	}
}
