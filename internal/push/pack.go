package push

import (
	"bufio"
	"compress/zlib"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// InflateRatio is how many bytes SkipPack inflates per byte read, beyond
// its fixed allowance; real packs stay far below it.
const InflateRatio = 32

// ErrBadPack is wrapped by every error SkipPack finds in the pack itself.
var ErrBadPack = errors.New("bad pack")

// Object types in a pack (gitformat-pack).
const (
	objCommit   = 1
	objTree     = 2
	objBlob     = 3
	objTag      = 4
	objOfsDelta = 6
	objRefDelta = 7
)

// SkipPack reads one pack from r up to and including its trailing
// checksum, and no further, without keeping any of it. A push that
// packwire refuses whole is answered only once its pack has ended: some
// clients (dulwich, libgit2, JGit over SSH) keep their side open waiting
// for the report, so reading until EOF would wait for as long as they do.
// hashLen is the object id length in bytes (20 for SHA-1, 32 for
// SHA-256). Each object's zlib stream is inflated to find its end; the
// inflated bytes are bounded by what the header declares, and all of
// them by maxInflated plus InflateRatio times the bytes read, since a
// refused pack is worth no more CPU than it takes to skip it (a zlib bomb
// inflates a thousandfold). It returns the bytes read.
func SkipPack(r *bufio.Reader, hashLen int, maxInflated int64) (int64, error) {
	cr := &countingByteReader{r: r}
	var header [12]byte
	if _, err := io.ReadFull(cr, header[:]); err != nil {
		return cr.n, fmt.Errorf("%w: header: %v", ErrBadPack, err)
	}
	if string(header[:4]) != "PACK" {
		return cr.n, fmt.Errorf("%w: no PACK signature", ErrBadPack)
	}
	if v := binary.BigEndian.Uint32(header[4:8]); v != 2 && v != 3 {
		return cr.n, fmt.Errorf("%w: version %d", ErrBadPack, v)
	}
	count := binary.BigEndian.Uint32(header[8:12])
	var inflated int64
	var zr io.ReadCloser
	for i := uint32(0); i < count; i++ {
		typ, size, err := readObjectHeader(cr)
		if err != nil {
			return cr.n, fmt.Errorf("%w: object %d: %v", ErrBadPack, i, err)
		}
		switch typ {
		case objCommit, objTree, objBlob, objTag:
		case objOfsDelta:
			if err := skipVarint(cr); err != nil {
				return cr.n, fmt.Errorf("%w: object %d: delta offset: %v", ErrBadPack, i, err)
			}
		case objRefDelta:
			if _, err := cr.Discard(hashLen); err != nil {
				return cr.n, fmt.Errorf("%w: object %d: delta base: %v", ErrBadPack, i, err)
			}
		default:
			return cr.n, fmt.Errorf("%w: object %d: unknown type %d", ErrBadPack, i, typ)
		}
		if zr == nil {
			zr, err = zlib.NewReader(cr)
		} else {
			err = zr.(zlib.Resetter).Reset(cr, nil)
		}
		if err != nil {
			return cr.n, fmt.Errorf("%w: object %d: %v", ErrBadPack, i, err)
		}
		// The stream must hold exactly size bytes: one more is an error, as
		// for index-pack.
		n, err := io.Copy(io.Discard, io.LimitReader(zr, int64(size)+1))
		if err != nil {
			return cr.n, fmt.Errorf("%w: object %d: %v", ErrBadPack, i, err)
		}
		if n != int64(size) {
			return cr.n, fmt.Errorf("%w: object %d: inflated to %d bytes, header says %d", ErrBadPack, i, n, size)
		}
		if inflated += n; inflated > maxInflated+InflateRatio*cr.n {
			return cr.n, fmt.Errorf("%w: inflates to more than %d bytes from %d", ErrBadPack, inflated, cr.n)
		}
	}
	if _, err := cr.Discard(hashLen); err != nil {
		return cr.n, fmt.Errorf("%w: trailer: %v", ErrBadPack, err)
	}
	return cr.n, nil
}

// readObjectHeader reads an object's type and inflated size: the type in
// bits 4-6 of the first byte, the size in 4 bits and then 7 bits a byte.
func readObjectHeader(r io.ByteReader) (typ int, size uint64, err error) {
	c, err := r.ReadByte()
	if err != nil {
		return 0, 0, err
	}
	typ = int(c>>4) & 7
	size = uint64(c & 0x0f)
	shift := uint(4)
	for c&0x80 != 0 {
		if shift > 60 {
			return 0, 0, errors.New("size too large")
		}
		if c, err = r.ReadByte(); err != nil {
			return 0, 0, err
		}
		size |= uint64(c&0x7f) << shift
		shift += 7
	}
	return typ, size, nil
}

// skipVarint skips an OFS_DELTA base offset (7 bits a byte, high bit set
// on all but the last).
func skipVarint(r io.ByteReader) error {
	for i := 0; ; i++ {
		if i > 9 {
			return errors.New("offset too long")
		}
		c, err := r.ReadByte()
		if err != nil {
			return err
		}
		if c&0x80 == 0 {
			return nil
		}
	}
}

// countingByteReader counts the bytes taken from a bufio.Reader. It is an
// io.ByteReader, so zlib reads exactly the compressed stream and no more.
type countingByteReader struct {
	r *bufio.Reader
	n int64
}

func (c *countingByteReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (c *countingByteReader) ReadByte() (byte, error) {
	b, err := c.r.ReadByte()
	if err == nil {
		c.n++
	}
	return b, err
}

func (c *countingByteReader) Discard(n int) (int, error) {
	d, err := c.r.Discard(n)
	c.n += int64(d)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return d, err
}
