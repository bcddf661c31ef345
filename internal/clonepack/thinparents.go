package clonepack

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"io"
)

// thinParents returns the parents named by the commits a pack stream
// (SHA-1) carries whole; a commit stored as a delta is skipped, as is
// everything after an entry that does not parse: the caller asks git
// about what it does not find here.
func thinParents(pack []byte) map[string]bool {
	parents := map[string]bool{}
	if len(pack) < 12+20 {
		return parents
	}
	r := bytes.NewReader(pack[12 : len(pack)-20])
	var zr io.ReadCloser
	for range binary.BigEndian.Uint32(pack[8:12]) {
		typ, err := readEntryHeader(r)
		if err != nil {
			return parents
		}
		switch typ {
		case 6: // OFS_DELTA: the base's offset
			for {
				c, err := r.ReadByte()
				if err != nil {
					return parents
				}
				if c&0x80 == 0 {
					break
				}
			}
		case 7: // REF_DELTA: the base's id
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
		if typ == 1 { // a commit: tree, then its parents
			sc := bufio.NewScanner(zr)
			for sc.Scan() {
				id, ok := bytes.CutPrefix(sc.Bytes(), []byte("parent "))
				if !ok && !bytes.HasPrefix(sc.Bytes(), []byte("tree ")) {
					break
				}
				if ok {
					parents[string(id)] = true
				}
			}
		}
		if _, err := io.Copy(io.Discard, zr); err != nil {
			return parents
		}
	}
	return parents
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
			return 0, io.ErrUnexpectedEOF
		}
		if c, err = r.ReadByte(); err != nil {
			return 0, err
		}
	}
	return typ, nil
}
