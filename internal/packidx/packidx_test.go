package packidx

import (
	"bytes"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"slices"
	"testing"
)

// build makes a version 2 .idx of ids (raw 20-byte names), as git writes
// one: sorted names, fanout, zero CRCs and offsets, checksums.
func build(ids [][]byte) []byte {
	ids = slices.Clone(ids)
	slices.SortFunc(ids, bytes.Compare)
	ids = slices.CompactFunc(ids, bytes.Equal)
	var b bytes.Buffer
	b.WriteString(magic)
	binary.Write(&b, binary.BigEndian, uint32(2))
	for i := 0; i < 256; i++ {
		n := 0
		for _, id := range ids {
			if int(id[0]) <= i {
				n++
			}
		}
		binary.Write(&b, binary.BigEndian, uint32(n))
	}
	for _, id := range ids {
		b.Write(id)
	}
	b.Write(make([]byte, 8*len(ids))) // CRCs, offsets
	b.Write(bytes.Repeat([]byte{7}, sha1.Size))
	sum := sha1.Sum(b.Bytes())
	b.Write(sum[:])
	return b.Bytes()
}

// FuzzIndex: Parse never panics on any bytes; an index it accepts finds
// exactly its names, and Lookup (on the same bytes, unloaded) agrees with
// Has for any id. Lookup never panics on any bytes either.
func FuzzIndex(f *testing.F) {
	f.Add([]byte{}, []byte("0123456789abcdefghij"))
	f.Add(bytes.Repeat([]byte{0xab}, 60), []byte("\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\x12\x13"))
	f.Fuzz(func(t *testing.T, seed, probe []byte) {
		// The seed as raw bytes and as names of a well-formed index.
		id := func(b []byte) string {
			var x [sha1.Size]byte
			copy(x[:], b)
			return hex.EncodeToString(x[:])
		}
		Lookup(bytes.NewReader(seed), int64(len(seed)), id(probe))
		if idx, err := Parse(seed); err == nil {
			if idx.Has(id(probe)) != Lookup(bytes.NewReader(seed), int64(len(seed)), id(probe)) {
				t.Fatalf("Has and Lookup disagree on %s", id(probe))
			}
		}
		var ids [][]byte
		for i := 0; i+sha1.Size <= len(seed); i += sha1.Size {
			ids = append(ids, seed[i:i+sha1.Size])
		}
		raw := build(ids)
		idx, err := Parse(raw)
		if err != nil {
			t.Fatalf("a well-formed index refused: %v", err)
		}
		for _, n := range ids {
			if !idx.Has(id(n)) || !Lookup(bytes.NewReader(raw), int64(len(raw)), id(n)) {
				t.Fatalf("%s not found", id(n))
			}
		}
		var p [sha1.Size]byte
		copy(p[:], probe)
		in := slices.ContainsFunc(ids, func(n []byte) bool { return bytes.Equal(n, p[:]) })
		if idx.Has(id(probe)) != in || Lookup(bytes.NewReader(raw), int64(len(raw)), id(probe)) != in {
			t.Fatalf("%s: found %v, in the pack %v", id(probe), idx.Has(id(probe)), in)
		}
		// Shortened, it is refused (checksum) and Lookup stays safe.
		if len(raw) > 1 {
			short := raw[:len(raw)/2]
			if _, err := Parse(short); err == nil {
				t.Fatal("half an index accepted")
			}
			Lookup(bytes.NewReader(short), int64(len(short)), id(probe))
		}
	})
}
