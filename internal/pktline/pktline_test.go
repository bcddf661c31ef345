package pktline

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	// Lengths around the reader's first buffer and its growth, then short again.
	lines := []string{"want 1234\n", "", "x", strings.Repeat("b", 508), strings.Repeat("c", 509), strings.Repeat("d", 2000),
		strings.Repeat("a", MaxPayload), "y", strings.Repeat("e", 1030)}
	for _, l := range lines {
		if err := Write(&buf, []byte(l)); err != nil {
			t.Fatal(err)
		}
	}
	WriteFlush(&buf)
	r := NewReader(&buf)
	for _, want := range lines {
		k, got, err := r.Read()
		if err != nil || k != Data || string(got) != want {
			t.Fatalf("got %v %q %v, want %q", k, got, err, want)
		}
	}
	if k, _, err := r.Read(); err != nil || k != Flush {
		t.Fatalf("want flush, got %v %v", k, err)
	}
	if _, _, err := r.Read(); err != io.EOF {
		t.Fatalf("want EOF, got %v", err)
	}
}

func TestSpecialAndBad(t *testing.T) {
	cases := []struct {
		in   string
		kind Kind
		err  error
	}{
		{"0001", Delim, nil},
		{"0002", ResponseEnd, nil},
		{"0003", Data, ErrBadLength},
		{"zzzz", Data, ErrBadLength},
		{"fff1", Data, ErrTooLong},
		{"0009abc", Data, io.ErrUnexpectedEOF},
		{"00", Data, io.ErrUnexpectedEOF},
		{"000A12345a", Data, nil},
	}
	for _, c := range cases {
		k, _, err := NewReader(strings.NewReader(c.in)).Read()
		if k != c.kind || !errors.Is(err, c.err) {
			t.Errorf("%q: got %v %v, want %v %v", c.in, k, err, c.kind, c.err)
		}
	}
}

func TestWriteTooLong(t *testing.T) {
	if err := Write(io.Discard, make([]byte, MaxPayload+1)); err != ErrTooLong {
		t.Fatalf("got %v", err)
	}
}

func TestWriteError(t *testing.T) {
	var buf bytes.Buffer
	WriteError(&buf, "repository 'x' not found")
	if got := buf.String(); got != "0021ERR repository 'x' not found\n" {
		t.Fatalf("got %q", got)
	}
}

// FuzzReader checks that no input makes the reader panic, loop or return a
// payload larger than a pkt-line can carry, and that what it accepts
// re-encodes to the same bytes.
func FuzzReader(f *testing.F) {
	for _, s := range []string{"0000", "0001", "0006a\n0000", "fff0", "0004", "zz", "000ahello\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		r := NewReader(bytes.NewReader(in))
		var out []byte
		consumed := 0
		for i := 0; i < len(in)+1; i++ {
			k, p, err := r.Read()
			if err != nil {
				return
			}
			if len(p) > MaxPayload {
				t.Fatalf("payload of %d bytes", len(p))
			}
			switch k {
			case Flush:
				out = append(out, "0000"...)
			case Delim:
				out = append(out, "0001"...)
			case ResponseEnd:
				out = append(out, "0002"...)
			default:
				out, _ = Append(out, p)
			}
			consumed = len(out)
			if !bytes.EqualFold(out, in[:consumed]) {
				t.Fatalf("re-encoded %q from %q", out, in[:consumed])
			}
		}
	})
}
