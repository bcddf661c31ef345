package reach

import (
	"bytes"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
)

// packIndex is the object ids of one pack, from its version 2 .idx
// (gitformat-pack): the fanout table and the sorted names, nothing else
// (offsets and CRCs are not needed to tell whether an object is in it).
// SHA-1 only: a SHA-256 repository's haves are left to git.
type packIndex struct {
	fanout [256]uint32
	names  []byte // sorted 20-byte ids
	pack   [sha1.Size]byte
}

const (
	idxHeader = 8 + 256*4 // magic, version, fanout
	idxMagic  = "\xfftOc"
)

// errBadIdx: a file that is not a whole, consistent version 2 .idx.
var errBadIdx = errors.New("not a valid pack index")

// readPackIndex loads the .idx at path, checking everything a lookup
// relies on: the magic and version, a non-decreasing fanout, a file long
// enough for its objects, the file's own SHA-1 trailer, and names
// ascending within their fanout buckets. A short or corrupt file is
// refused rather than trusted to pass haves.
func readPackIndex(path string) (*packIndex, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parsePackIndex(b)
}

func parsePackIndex(b []byte) (*packIndex, error) {
	const h = sha1.Size
	if len(b) < idxHeader+2*h || string(b[:4]) != idxMagic || binary.BigEndian.Uint32(b[4:8]) != 2 {
		return nil, fmt.Errorf("%w: no version 2 header", errBadIdx)
	}
	if sum := sha1.Sum(b[:len(b)-h]); !bytes.Equal(sum[:], b[len(b)-h:]) {
		return nil, fmt.Errorf("%w: checksum mismatch", errBadIdx)
	}
	idx := &packIndex{}
	prev := uint32(0)
	for i := range idx.fanout {
		v := binary.BigEndian.Uint32(b[8+4*i:])
		if v < prev {
			return nil, fmt.Errorf("%w: fanout decreases at %02x", errBadIdx, i)
		}
		idx.fanout[i], prev = v, v
	}
	n := int64(prev)
	// names, CRC32s, 4-byte offsets; then 8-byte offsets (at most one per
	// object) and the two trailing checksums.
	least := int64(idxHeader) + n*(h+4+4) + 2*h
	if rest := int64(len(b)) - least; rest < 0 || rest%8 != 0 || rest/8 > n {
		return nil, fmt.Errorf("%w: %d bytes for %d objects", errBadIdx, len(b), n)
	}
	names := b[idxHeader : idxHeader+n*h]
	first := 0
	for i := 0; i < int(n); i++ {
		name := names[i*h : (i+1)*h]
		for uint32(i) >= idx.fanout[first] {
			first++
		}
		if int(name[0]) != first || i > 0 && bytes.Compare(names[(i-1)*h:i*h], name) >= 0 {
			return nil, fmt.Errorf("%w: object %d out of order", errBadIdx, i)
		}
	}
	idx.names = bytes.Clone(names) // not the rest of the file
	copy(idx.pack[:], b[len(b)-2*h:len(b)-h])
	return idx, nil
}

// has tells whether the pack holds the object id (40 hex digits): its
// fanout bucket, then a binary search within it.
func (idx *packIndex) has(id string) bool {
	var want [sha1.Size]byte
	if len(id) != 2*sha1.Size {
		return false
	}
	if _, err := hex.Decode(want[:], []byte(id)); err != nil {
		return false
	}
	lo := uint32(0)
	if want[0] > 0 {
		lo = idx.fanout[want[0]-1]
	}
	hi := idx.fanout[want[0]]
	for lo < hi {
		mid := lo + (hi-lo)/2
		switch c := bytes.Compare(idx.names[mid*sha1.Size:(mid+1)*sha1.Size], want[:]); {
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

// size is the memory a kept index takes.
func (idx *packIndex) size() int64 { return int64(len(idx.names)) + 256*4 + sha1.Size }
