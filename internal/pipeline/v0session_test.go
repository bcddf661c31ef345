package pipeline

import (
	"strings"
	"testing"
)

// TestOpeningLength: a v0 client's opening is what it sends before it
// needs an answer beyond the advertisement.
func TestOpeningLength(t *testing.T) {
	const x = "want 1111111111111111111111111111111111111111 multi_ack_detailed"
	const h = "have 2222222222222222222222222222222222222222"
	for _, tc := range []struct {
		name   string
		data   []byte
		length int
		status openingStatus
	}{
		{"ls-remote", pkts(""), 4, openingComplete},
		{"clone", append(pkts(x, "", "done"), "junk"...), len(pkts(x, "", "done")), openingComplete},
		{"two batches", append(pkts(x, "", h, ""), pkts(h, "")...), len(pkts(x, "", h, "")), openingComplete},
		{"shallow waits for its shallow lines", pkts(x, "deepen 1", ""), len(pkts(x, "deepen 1", "")), openingComplete},
		{"not yet", pkts(x, "", h), 0, openingGone},
		{"half a packet", pkts(x)[:10], 0, openingGone},
		{"not pkt-lines", []byte("GET / HTTP/1.1\r\n"), 0, openingUncacheable},
		{"a delimiter", []byte("0001"), 0, openingUncacheable},
	} {
		n, status := new(openingScanner).scan(tc.data)
		if n != tc.length || status != tc.status {
			t.Errorf("%s: %d %v, want %d %v", tc.name, n, status, tc.length, tc.status)
		}
	}
}

// TestOpeningScannerResumes: a scanner fed a stream as it grows resumes
// after the last whole pkt-line instead of parsing from the first byte
// again (a client trickling a 1 MiB opening a byte at a time would
// otherwise cost a quadratic parse), and finds the same end.
func TestOpeningScannerResumes(t *testing.T) {
	const h = "have 2222222222222222222222222222222222222222"
	lines := []string{"want 1111111111111111111111111111111111111111", ""}
	for range 2000 {
		lines = append(lines, h)
	}
	data := pkts(append(lines, "")...)
	var s openingScanner
	for end := 0; end < len(data); end++ {
		before := s.pos
		if n, status := s.scan(data[:end]); status != openingGone || n != 0 {
			t.Fatalf("complete after %d of %d bytes: %d %v", end, len(data), n, status)
		}
		if s.pos < before || s.pos > end {
			t.Fatalf("scanner at %d after %d bytes (was %d)", s.pos, end, before)
		}
	}
	if n, status := s.scan(data); n != len(data) || status != openingComplete {
		t.Fatalf("whole: %d %v, want %d complete", n, status, len(data))
	}
}

// FuzzOpeningLength: any bytes give an opening within them that is whole
// pkt-lines ending at a flush or done, or none.
func FuzzOpeningLength(f *testing.F) {
	f.Add(pkts("want 1 x", "", "have 2", ""))
	f.Add(pkts(""))
	f.Add([]byte("0004000a"))
	f.Fuzz(func(t *testing.T, data []byte) {
		n, status := new(openingScanner).scan(data)
		// Fed as it grows (a trickling client), the scanner says the same.
		var s openingScanner
		tn, tstatus := 0, openingGone
		for end := 0; end <= len(data) && tstatus == openingGone; end++ {
			tn, tstatus = s.scan(data[:end])
		}
		if tn != n || tstatus != status {
			t.Fatalf("trickled: %d %v, whole: %d %v", tn, tstatus, n, status)
		}
		if status != openingComplete {
			if n != 0 {
				t.Fatalf("incomplete opening of %d bytes", n)
			}
			return
		}
		if n < 4 || n > len(data) {
			t.Fatalf("opening of %d bytes in %d", n, len(data))
		}
		if end := string(data[n-4 : n]); end != "0000" && !strings.HasSuffix(string(data[:n]), "done\n") && !strings.HasSuffix(string(data[:n]), "done") {
			t.Fatalf("opening ends with %q", data[max(0, n-8):n])
		}
	})
}

// TestAdvertisementTapKeepsOnlyWholeOnes: the tap keeps an advertisement
// only when its pkt-lines end at their flush; one cut off right after a
// "0000" inside a ref line is not whole.
func TestAdvertisementTapKeepsOnlyWholeOnes(t *testing.T) {
	line := "003f1111111111111111111111111111111111111111 refs/heads/a0000b\n"
	whole := line + "0000"
	var a advertisementTap
	a.add([]byte(whole))
	if string(a.answer()) != whole {
		t.Fatalf("a whole advertisement was not kept: %q", a.answer())
	}
	cut := line[:strings.Index(line, "0000")+4]
	var b advertisementTap
	b.add([]byte(cut))
	if got := b.answer(); got != nil {
		t.Fatalf("an advertisement cut after a 0000 inside a ref name was kept: %q", got)
	}
}
