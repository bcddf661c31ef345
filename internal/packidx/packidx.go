// Package packidx answers whether a pack holds an object, from the
// pack's version 2 .idx (gitformat-pack): the fanout table and the sorted
// names, nothing else (offsets and CRCs are not needed for that). SHA-1
// only: a SHA-256 repository's objects are left to git.
//
// Two forms: Index, the whole file loaded and checked once, for lookups
// repeated many times (the haves a served bundle holds); and Lookup, a
// few reads of a file left on disk, for a lookup or two (is a push's
// new value in the pack receive-pack kept).
package packidx

import (
	"bytes"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
)

const (
	header = 8 + 256*4 // magic, version, fanout
	magic  = "\xfftOc"
)

// ErrBad: a file that is not a whole, consistent version 2 .idx.
var ErrBad = errors.New("not a valid pack index")

// Index is the object ids of one pack.
type Index struct {
	fanout [256]uint32
	names  []byte // sorted 20-byte ids
	// Pack is the checksum of the pack the index describes.
	Pack [sha1.Size]byte
}

// Read loads the .idx at path (see Parse).
func Read(path string) (*Index, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(b)
}

// Parse checks everything a lookup relies on: the magic and version, a
// non-decreasing fanout, a file long enough for its objects, the file's
// own SHA-1 trailer, and names ascending within their fanout buckets. A
// short or corrupt file is refused rather than trusted.
func Parse(b []byte) (*Index, error) {
	const h = sha1.Size
	if len(b) < header+2*h || string(b[:4]) != magic || binary.BigEndian.Uint32(b[4:8]) != 2 {
		return nil, fmt.Errorf("%w: no version 2 header", ErrBad)
	}
	if sum := sha1.Sum(b[:len(b)-h]); !bytes.Equal(sum[:], b[len(b)-h:]) {
		return nil, fmt.Errorf("%w: checksum mismatch", ErrBad)
	}
	idx := &Index{}
	prev := uint32(0)
	for i := range idx.fanout {
		v := binary.BigEndian.Uint32(b[8+4*i:])
		if v < prev {
			return nil, fmt.Errorf("%w: fanout decreases at %02x", ErrBad, i)
		}
		idx.fanout[i], prev = v, v
	}
	n := int64(prev)
	// names, CRC32s, 4-byte offsets; then 8-byte offsets (at most one per
	// object) and the two trailing checksums.
	least := int64(header) + n*(h+4+4) + 2*h
	if rest := int64(len(b)) - least; rest < 0 || rest%8 != 0 || rest/8 > n {
		return nil, fmt.Errorf("%w: %d bytes for %d objects", ErrBad, len(b), n)
	}
	names := b[header : header+n*h]
	first := 0
	for i := 0; i < int(n); i++ {
		name := names[i*h : (i+1)*h]
		for uint32(i) >= idx.fanout[first] {
			first++
		}
		if int(name[0]) != first || i > 0 && bytes.Compare(names[(i-1)*h:i*h], name) >= 0 {
			return nil, fmt.Errorf("%w: object %d out of order", ErrBad, i)
		}
	}
	idx.names = bytes.Clone(names) // not the rest of the file
	copy(idx.Pack[:], b[len(b)-2*h:len(b)-h])
	return idx, nil
}

// Has tells whether the pack holds the object id (40 hex digits).
func (idx *Index) Has(id string) bool {
	want, ok := decode(id)
	if !ok {
		return false
	}
	lo, hi := bucket(want, func(i int) uint32 { return idx.fanout[i] })
	return search(lo, hi, want, func(i uint32) []byte { return idx.names[i*sha1.Size : (i+1)*sha1.Size] })
}

// Len is the number of objects in the pack.
func (idx *Index) Len() int { return int(idx.fanout[255]) }

// Size is the memory a loaded index takes.
func (idx *Index) Size() int64 { return int64(len(idx.names)) + 256*4 + sha1.Size }

// Lookup tells whether the .idx in r (size bytes) lists the object id,
// reading its header and the names a binary search visits. It trusts the
// file's order (a file being written by git, say, is not checksummed):
// a wrong answer is false, and a short or foreign file answers false.
func Lookup(r io.ReaderAt, size int64, id string) bool {
	want, ok := decode(id)
	if !ok {
		return false
	}
	var head [header]byte
	if _, err := r.ReadAt(head[:], 0); err != nil || string(head[:4]) != magic || binary.BigEndian.Uint32(head[4:8]) != 2 {
		return false
	}
	lo, hi := bucket(want, func(i int) uint32 { return binary.BigEndian.Uint32(head[8+4*i:]) })
	if int64(header)+int64(hi)*sha1.Size > size {
		return false
	}
	name := make([]byte, sha1.Size)
	failed := false
	found := search(lo, hi, want, func(i uint32) []byte {
		if _, err := r.ReadAt(name, int64(header)+int64(i)*sha1.Size); err != nil {
			failed = true
			return want[:] // stops the search; the answer is then false
		}
		return name
	})
	return found && !failed
}

func decode(id string) ([sha1.Size]byte, bool) {
	var want [sha1.Size]byte
	if len(id) != 2*sha1.Size {
		return want, false
	}
	_, err := hex.Decode(want[:], []byte(id))
	return want, err == nil
}

// bucket is the range of names whose first byte is want's (the fanout
// holds, for each first byte, how many names are at or below it).
func bucket(want [sha1.Size]byte, fanout func(int) uint32) (lo, hi uint32) {
	if want[0] > 0 {
		lo = fanout(int(want[0]) - 1)
	}
	return lo, fanout(int(want[0]))
}

// search is a binary search of names [lo, hi) for want.
func search(lo, hi uint32, want [sha1.Size]byte, name func(uint32) []byte) bool {
	for lo < hi {
		mid := lo + (hi-lo)/2
		switch c := bytes.Compare(name(mid), want[:]); {
		case c == 0:
			return true
		case c < 0:
			lo = mid + 1
		default:
			hi = mid
		}
	}
	return false
}
