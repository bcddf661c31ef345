package lfs

import (
	"bytes"
	"strconv"
)

// MaxPointerSize: a blob larger than this is not an LFS pointer (git-lfs
// writes ~130 bytes and reads at most 1 KiB of a candidate).
const MaxPointerSize = 1024

// Pointer is what an LFS pointer file names.
type Pointer struct {
	OID  string
	Size int64
}

// ParsePointer reads an LFS pointer file (git-lfs docs/spec.md): a version
// line first, then "key value" lines, among them "oid sha256:HEX" and
// "size N". ok is false for anything else.
func ParsePointer(b []byte) (Pointer, bool) {
	if len(b) > MaxPointerSize || !bytes.HasPrefix(b, []byte("version https://git-lfs.github.com/spec/v1\n")) &&
		!bytes.HasPrefix(b, []byte("version https://hawser.github.com/spec/v1\n")) {
		return Pointer{}, false
	}
	var p Pointer
	size := false
	for _, line := range bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n"))[1:] {
		k, v, ok := bytes.Cut(line, []byte(" "))
		if !ok {
			return Pointer{}, false
		}
		switch string(k) {
		case "oid":
			hex, ok := bytes.CutPrefix(v, []byte("sha256:"))
			if !ok || !ValidOID(string(hex)) {
				return Pointer{}, false
			}
			p.OID = string(hex)
		case "size":
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil || n < 0 {
				return Pointer{}, false
			}
			p.Size, size = n, true
		}
	}
	return p, p.OID != "" && size
}
