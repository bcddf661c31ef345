// Package pktline reads and writes git's pkt-line framing (gitprotocol-common):
// a four-hex-digit length that counts itself, then the payload. 0000 is a
// flush, 0001 a delimiter and 0002 a response-end (protocol v2).
package pktline

import (
	"errors"
	"fmt"
	"io"
)

// MaxLength is the largest pkt-line git accepts, length prefix included.
const MaxLength = 65520

// MaxPayload is the largest payload that fits in one pkt-line.
const MaxPayload = MaxLength - 4

// Kind tells a data line from the special packets.
type Kind int

const (
	Data Kind = iota
	Flush
	Delim
	ResponseEnd
)

var (
	ErrBadLength = errors.New("pkt-line: invalid length prefix")
	ErrTooLong   = errors.New("pkt-line: length exceeds 65520")
)

// Reader reads pkt-lines from an underlying stream without reading ahead,
// so the rest of the stream can be handed on untouched.
type Reader struct {
	r   io.Reader
	buf []byte // small, or grown to the longest packet so far
	// small holds the packets of most requests (commands, wants, haves):
	// a Reader per request used to allocate and zero MaxLength bytes.
	small [512]byte
}

// NewReader returns a Reader that reads exactly one packet per call from r.
func NewReader(r io.Reader) *Reader {
	p := &Reader{r: r}
	p.buf = p.small[:]
	return p
}

// Read returns the next packet. The payload aliases an internal buffer and is
// valid until the next call. A clean EOF before any byte returns io.EOF; a
// packet cut short returns io.ErrUnexpectedEOF.
func (p *Reader) Read() (Kind, []byte, error) {
	if p.buf == nil {
		p.buf = p.small[:]
	}
	if _, err := io.ReadFull(p.r, p.buf[:4]); err != nil {
		return Data, nil, err
	}
	n, err := ParseLength(p.buf[:4])
	if err != nil {
		return Data, nil, err
	}
	switch n {
	case 0:
		return Flush, nil, nil
	case 1:
		return Delim, nil, nil
	case 2:
		return ResponseEnd, nil, nil
	case 3:
		return Data, nil, ErrBadLength
	}
	if n > MaxLength {
		return Data, nil, ErrTooLong
	}
	if n > len(p.buf) {
		p.buf = make([]byte, max(n, min(2*len(p.buf), MaxLength)))
	}
	payload := p.buf[4:n]
	if _, err := io.ReadFull(p.r, payload); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Data, nil, err
	}
	return Data, payload, nil
}

// ParseLength decodes a four-hex-digit length prefix (either case).
func ParseLength(b []byte) (int, error) {
	if len(b) != 4 {
		return 0, ErrBadLength
	}
	n := 0
	for _, c := range b {
		var v byte
		switch {
		case c >= '0' && c <= '9':
			v = c - '0'
		case c >= 'a' && c <= 'f':
			v = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			v = c - 'A' + 10
		default:
			return 0, ErrBadLength
		}
		n = n<<4 | int(v)
	}
	return n, nil
}

const hexDigits = "0123456789abcdef"

// Append appends payload framed as one pkt-line to dst.
func Append(dst, payload []byte) ([]byte, error) {
	if len(payload) > MaxPayload {
		return dst, ErrTooLong
	}
	n := len(payload) + 4
	dst = append(dst, hexDigits[n>>12&0xf], hexDigits[n>>8&0xf], hexDigits[n>>4&0xf], hexDigits[n&0xf])
	return append(dst, payload...), nil
}

// Write writes payload as one pkt-line.
func Write(w io.Writer, payload []byte) error {
	b, err := Append(make([]byte, 0, len(payload)+4), payload)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// Writef formats and writes one pkt-line.
func Writef(w io.Writer, format string, args ...any) error {
	return Write(w, fmt.Appendf(nil, format, args...))
}

// WriteFlush writes a flush packet (0000).
func WriteFlush(w io.Writer) error {
	_, err := io.WriteString(w, "0000")
	return err
}

// WriteError writes an ERR packet; git prints it as "fatal: remote error: msg".
func WriteError(w io.Writer, msg string) error {
	if len(msg) > MaxPayload-5 {
		msg = msg[:MaxPayload-5]
	}
	return Writef(w, "ERR %s\n", msg)
}
