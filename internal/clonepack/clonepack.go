// Package clonepack answers a full clone of a maintained repository with
// no git at all: maintenance builds a preferred pack that is exactly the
// closure of the branch, tag and HEAD tips (internal/maintain), and a pack
// file is a valid pack stream, trailer included. So when a fetch wants
// exactly those tips and nothing else shapes the answer (no haves, no
// shallow or deepen, no filter, ofs-delta accepted, a side band asked
// for), its answer is that file, framed in the side band.
//
// The proof that the file is still the answer is cheap and does not
// depend on the refs now: the state file maintenance writes atomically
// names the pack and the digest of the tips it is the closure of
// (maintain.State.TipsDigest); the wants must have that digest, and the
// opened file's trailer must be the checksum its name carries. A push, a
// rebuild or a rewind makes the wants or the state differ: git answers.
package clonepack

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strings"

	"packwire/internal/fetchcache"
	"packwire/internal/maintain"
	"packwire/internal/oid"
	"packwire/internal/pktline"
)

// Outcome is what the governor records (its pack_cache column) for a
// request answered from the preferred pack.
const Outcome = "clone-pack-file"

// ErrNotClone is a request this package does not answer: git does.
var ErrNotClone = errors.New("not a plain full clone of the preferred pack")

// Clone is a fetch request that may be answered from the preferred pack.
type Clone struct {
	Wants []string // distinct wanted object ids, in the client's order
	V2    bool
	// Band is the largest side-band packet the client takes (65520 with
	// side-band-64k, 1000 with side-band; v2 always has the 64k band).
	Band int
}

// Parse reads body, a whole stateless fetch request (a v2 fetch command,
// or a v0/v1 request: wants, flush, done), and returns it when it is a
// plain full clone: wants only, "done", ofs-delta, a side band; nothing
// that changes which objects or framing git would send.
func Parse(body []byte, v2 bool) (Clone, error) {
	if v2 {
		return parseV2(body)
	}
	return parseV0(body)
}

func parseV2(body []byte) (Clone, error) {
	cmd, err := fetchcache.InspectCommand(body)
	if err != nil || cmd.Name != "fetch" {
		return Clone{}, ErrNotClone
	}
	c := Clone{V2: true, Band: pktline.MaxLength}
	ofs, done := false, false
	for _, arg := range cmd.Args {
		word, rest, _ := bytes.Cut(arg, []byte(" "))
		switch string(word) {
		case "want":
			if !oid.Valid(string(rest)) {
				return Clone{}, ErrNotClone
			}
			c.Wants = append(c.Wants, string(rest))
		case "ofs-delta":
			ofs = true
		case "done":
			done = true
		case "thin-pack", "no-progress", "include-tag":
			// A full clone's pack is thin of nothing and holds every
			// tag it could include; progress is optional.
		default:
			// have, shallow, deepen*, filter, want-ref, sideband-all,
			// packfile-uris, wait-for-done, anything newer: git.
			return Clone{}, ErrNotClone
		}
	}
	if !ofs || !done || len(c.Wants) == 0 {
		return Clone{}, ErrNotClone
	}
	c.Wants = distinct(c.Wants)
	return c, nil
}

func parseV0(body []byte) (Clone, error) {
	var c Clone
	ofs := false
	r := pktline.NewReader(bytes.NewReader(body))
	// want lines, the first with capabilities
	for {
		kind, line, err := r.Read()
		if err != nil {
			return Clone{}, ErrNotClone
		}
		if kind == pktline.Flush {
			break
		}
		if kind != pktline.Data {
			return Clone{}, ErrNotClone
		}
		fields := strings.Fields(string(line))
		if len(fields) < 2 || fields[0] != "want" || !oid.Valid(fields[1]) {
			return Clone{}, ErrNotClone // shallow, deepen, filter: git
		}
		if len(c.Wants) == 0 {
			for _, capability := range fields[2:] {
				switch capability {
				case "ofs-delta":
					ofs = true
				case "side-band-64k":
					c.Band = pktline.MaxLength
				case "side-band":
					c.Band = max(c.Band, 1000)
				}
			}
		} else if len(fields) != 2 {
			return Clone{}, ErrNotClone
		}
		c.Wants = append(c.Wants, fields[1])
	}
	kind, line, err := r.Read()
	if err != nil || kind != pktline.Data || strings.TrimSuffix(string(line), "\n") != "done" {
		return Clone{}, ErrNotClone // haves: git
	}
	if _, _, err := r.Read(); err != io.EOF {
		return Clone{}, ErrNotClone
	}
	if !ofs || c.Band == 0 || len(c.Wants) == 0 {
		return Clone{}, ErrNotClone
	}
	c.Wants = distinct(c.Wants)
	return c, nil
}

func distinct(ids []string) []string {
	seen := make(map[string]bool, len(ids))
	out := ids[:0]
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

// Pack is an open preferred pack proven to be the answer to a Clone.
type Pack struct {
	f    *os.File
	size int64
}

// Open returns the preferred pack of the repository at dir when it is
// exactly the closure of c's wants, ErrNotClone otherwise.
func Open(dir string, c Clone) (*Pack, error) {
	st, err := maintain.ReadState(dir)
	if err != nil || st == nil || st.TipsDigest == "" || st.TipsDigest != maintain.TipsDigest(c.Wants) {
		return nil, ErrNotClone
	}
	if _, err := os.Stat(filepath.Join(dir, "shallow")); err == nil {
		return nil, ErrNotClone // a shallow repository's clones get shallow lines
	}
	sum, ok := strings.CutPrefix(strings.TrimSuffix(st.Preferred, ".pack"), "pack-")
	want, err := hex.DecodeString(sum)
	if !ok || err != nil || len(want) < 20 || strings.ContainsAny(st.Preferred, `/\`) {
		return nil, ErrNotClone
	}
	f, err := os.Open(filepath.Join(dir, "objects", "pack", st.Preferred))
	if err != nil {
		return nil, ErrNotClone // replaced by a newer run since
	}
	p, err := check(f, want)
	if err != nil {
		f.Close()
		return nil, err
	}
	return p, nil
}

// check proves that f is the pack whose checksum its name carries (git
// names a pack after its trailer): the file opened is the one the state
// names, whatever happened to the directory since.
func check(f *os.File, sum []byte) (*Pack, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := fi.Size()
	if size < 12+int64(len(sum)) {
		return nil, ErrNotClone
	}
	var head [12]byte
	trailer := make([]byte, len(sum))
	if _, err := f.ReadAt(head[:], 0); err != nil {
		return nil, err
	}
	if _, err := f.ReadAt(trailer, size-int64(len(sum))); err != nil {
		return nil, err
	}
	if string(head[:4]) != "PACK" || !bytes.Equal(trailer, sum) {
		return nil, fmt.Errorf("%w: %s is not the pack its name says", ErrNotClone, f.Name())
	}
	return &Pack{f: f, size: size}, nil
}

// Size is the pack file's size.
func (p *Pack) Size() int64 { return p.size }

// Close closes the pack file.
func (p *Pack) Close() error { return p.f.Close() }

// chunk is how much of a pack is read at once: large reads, few
// syscalls, and a 1 MiB write wakes the fetch cache's followers once.
const chunk = 1 << 20

// WriteResponse writes the whole answer git would give c (its bytes may
// differ, not its meaning): v2 "packfile" section, or v0 "NAK"; the pack
// in side-band packets of at most c.Band bytes; a flush. No progress.
func (p *Pack) WriteResponse(w io.Writer, c Clone) (int64, error) {
	f, err := newFramer(w, c)
	if err != nil {
		return 0, err
	}
	if err := copyRange(f, p.f, 0, p.size, nil); err != nil {
		return f.written, err
	}
	return f.end()
}

// copyRange sends [from, to) of r through f, hashing it too when h is
// not nil. Each packet's data is read straight into its place in f's
// buffer: one copy from the page cache, one to the client.
func copyRange(f *framer, r io.ReaderAt, from, to int64, h hash.Hash) error {
	for off := from; off < to; {
		k := int(min(int64(f.data), to-off))
		at := len(f.out)
		f.out = appendBandHeader(f.out, k)
		f.out = f.out[:at+5+k]
		n, err := r.ReadAt(f.out[at+5:], off)
		if n < k {
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		if h != nil {
			h.Write(f.out[at+5:])
		}
		off += int64(k)
		if len(f.out) >= chunk {
			if err := f.flushOut(); err != nil {
				return err
			}
		}
	}
	return nil
}

// framer writes git's first line of a fetch answer, then data in band-1
// packets, batched into writes of about a chunk, then a flush.
type framer struct {
	w       io.Writer
	data    int // payload bytes per packet
	out     []byte
	written int64
}

func newFramer(w io.Writer, c Clone) (*framer, error) {
	head := "NAK\n"
	if c.V2 {
		head = "packfile\n"
	}
	data := c.Band - 5 // 4 bytes of length, 1 of band
	if data <= 0 {
		return nil, ErrNotClone
	}
	f := &framer{w: w, data: data, out: make([]byte, 0, chunk+data+(chunk/data+2)*5+64)}
	f.out, _ = pktline.Append(f.out, []byte(head))
	return f, nil
}

func (f *framer) write(b []byte) error {
	for len(b) > 0 {
		k := min(len(b), f.data)
		f.out = appendBand(f.out, b[:k])
		b = b[k:]
		if len(f.out) >= chunk {
			if err := f.flushOut(); err != nil {
				return err
			}
		}
	}
	return nil
}

func (f *framer) flushOut() error {
	n, err := f.w.Write(f.out)
	f.written += int64(n)
	f.out = f.out[:0]
	return err
}

// end writes the flush that ends the answer, and what is left.
func (f *framer) end() (int64, error) {
	f.out = append(f.out, "0000"...)
	err := f.flushOut()
	return f.written, err
}

// appendBand appends one band-1 packet of data.
func appendBand(out, data []byte) []byte {
	return append(appendBandHeader(out, len(data)), data...)
}

// appendBandHeader appends the length and band of a band-1 packet of n
// bytes of data.
func appendBandHeader(out []byte, n int) []byte {
	const digits = "0123456789abcdef"
	n += 5
	return append(out, digits[n>>12&15], digits[n>>8&15], digits[n>>4&15], digits[n&15], 1)
}
