package clonepack

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"errors"
	"io"
)

// Pack entry types (gitformat-pack).
const (
	entryCommit   = 1
	entryOfsDelta = 6
	entryRefDelta = 7
)

// thinParents returns the parents named by the commits a pack stream
// (SHA-1) carries: whole, or as a delta (OFS_DELTA) against another
// commit of the same pack, which pack-objects does for most of a push's
// commits. A commit stored otherwise is skipped, as is everything after
// an entry that does not parse: the caller asks git about what it does
// not find here.
func thinParents(pack []byte) map[string]bool {
	parents := map[string]bool{}
	if len(pack) < 12+20 {
		return parents
	}
	body := pack[:len(pack)-20]
	r := bytes.NewReader(body)
	r.Seek(12, io.SeekStart)
	commits := map[int64][]byte{} // offset -> content, for deltas against them
	var zr io.ReadCloser
	for range binary.BigEndian.Uint32(pack[8:12]) {
		at := int64(len(body) - r.Len())
		typ, err := readEntryHeader(r)
		if err != nil {
			return parents
		}
		base := int64(-1)
		switch typ {
		case entryOfsDelta:
			back, err := readOfsDelta(r)
			if err != nil {
				return parents
			}
			base = at - back
		case entryRefDelta:
			if _, err := r.Seek(20, io.SeekCurrent); err != nil {
				return parents
			}
		}
		// bytes.Reader is an io.ByteReader: zlib reads exactly its stream.
		if zr == nil {
			zr, err = zlib.NewReader(r)
		} else {
			err = zr.(zlib.Resetter).Reset(r, nil)
		}
		if err != nil {
			return parents
		}
		var content []byte
		if typ == entryCommit || commits[base] != nil {
			data, err := io.ReadAll(zr)
			if err != nil {
				return parents
			}
			content = data
			if typ == entryOfsDelta {
				if content, err = applyDelta(commits[base], data); err != nil {
					return parents
				}
			}
			commits[at] = content
			addParents(parents, content)
		} else if _, err := io.Copy(io.Discard, zr); err != nil {
			return parents
		}
	}
	return parents
}

// addParents adds the parents a commit's header names.
func addParents(parents map[string]bool, commit []byte) {
	sc := bufio.NewScanner(bytes.NewReader(commit))
	for sc.Scan() {
		id, ok := bytes.CutPrefix(sc.Bytes(), []byte("parent "))
		if !ok && !bytes.HasPrefix(sc.Bytes(), []byte("tree ")) {
			return
		}
		if ok {
			parents[string(id)] = true
		}
	}
}

// readEntryHeader reads a pack entry's type and skips its size: the type
// in bits 4-6 of the first byte, the size in the rest of it and of the
// bytes after while their high bit is set.
func readEntryHeader(r io.ByteReader) (int, error) {
	c, err := r.ReadByte()
	if err != nil {
		return 0, err
	}
	typ := int(c>>4) & 7
	for i := 0; c&0x80 != 0; i++ {
		if i > 9 {
			return 0, errBadEntry
		}
		if c, err = r.ReadByte(); err != nil {
			return 0, err
		}
	}
	return typ, nil
}

var errBadEntry = errors.New("bad pack entry")

// readOfsDelta reads how far before the entry its OFS_DELTA base starts.
func readOfsDelta(r io.ByteReader) (int64, error) {
	c, err := r.ReadByte()
	if err != nil {
		return 0, err
	}
	back := int64(c & 0x7f)
	for i := 0; c&0x80 != 0; i++ {
		if i > 8 {
			return 0, errBadEntry
		}
		if c, err = r.ReadByte(); err != nil {
			return 0, err
		}
		back = (back+1)<<7 | int64(c&0x7f)
	}
	return back, nil
}

// applyDelta rebuilds an object from its base and a git delta: the two
// sizes, then instructions to copy a stretch of the base or insert bytes.
func applyDelta(base, delta []byte) ([]byte, error) {
	src, n := binary.Uvarint(delta)
	if n <= 0 || src != uint64(len(base)) {
		return nil, errBadEntry
	}
	delta = delta[n:]
	size, n := binary.Uvarint(delta)
	if n <= 0 || size > 1<<24 {
		return nil, errBadEntry
	}
	delta = delta[n:]
	out := make([]byte, 0, size)
	for len(delta) > 0 {
		op := delta[0]
		delta = delta[1:]
		switch {
		case op&0x80 != 0: // copy: offset in up to 4 bytes, size in up to 3
			var off, k uint64
			for i := range 7 {
				if op&(1<<i) == 0 {
					continue
				}
				if len(delta) == 0 {
					return nil, errBadEntry
				}
				if i < 4 {
					off |= uint64(delta[0]) << (8 * i)
				} else {
					k |= uint64(delta[0]) << (8 * (i - 4))
				}
				delta = delta[1:]
			}
			if k == 0 {
				k = 0x10000
			}
			if off+k > uint64(len(base)) {
				return nil, errBadEntry
			}
			out = append(out, base[off:off+k]...)
		case op != 0: // insert op bytes
			if int(op) > len(delta) {
				return nil, errBadEntry
			}
			out = append(out, delta[:op]...)
			delta = delta[op:]
		default:
			return nil, errBadEntry
		}
	}
	if uint64(len(out)) != size {
		return nil, errBadEntry
	}
	return out, nil
}
