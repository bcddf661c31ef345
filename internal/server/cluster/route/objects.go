package route

import (
	"bufio"
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"packwire/internal/diskspace"
	"packwire/internal/oid"
)

// migrate moves the quarantine's pack into the repository's objects, the
// index last (a pack is used once its index is there). A replication
// brings one pack and no loose object (receivePack).
func migrate(quarantine, objects string) error {
	files, err := os.ReadDir(filepath.Join(quarantine, "pack"))
	if err != nil {
		return err
	}
	rank := func(name string) int {
		if strings.HasSuffix(name, ".idx") {
			return 1
		}
		return 0
	}
	sort.SliceStable(files, func(i, j int) bool { return rank(files[i].Name()) < rank(files[j].Name()) })
	for _, f := range files {
		// A pack is named by its checksum (receivePack checks it): one
		// already here holds the same objects and is never replaced.
		dst := filepath.Join(objects, "pack", f.Name())
		if _, err := os.Lstat(dst); err == nil {
			continue
		}
		if err := os.Rename(filepath.Join(quarantine, "pack", f.Name()), dst); err != nil {
			return err
		}
	}
	return nil
}

// receivePack stores the pack and index a primary sent (after the
// updates: "pack <id> <pack size> <index size>\n", then both files) in
// the quarantine, after checking that neither was cut short or damaged:
// each file's trailing checksum, and the index's record of the pack's.
func receivePack(body *bufio.Reader, quarantine string) error {
	line, err := body.ReadString('\n')
	if err != nil {
		return fmt.Errorf("reading the pack's header: %w", err)
	}
	var name string
	var packSize, idxSize int64
	if n, err := fmt.Sscanf(line, "pack %s %d %d\n", &name, &packSize, &idxSize); n != 3 || err != nil || !oid.Valid(name) {
		return fmt.Errorf("bad pack header %q", strings.TrimSpace(line))
	}
	newHash := sha1.New
	if len(name) == 64 {
		newHash = sha256.New
	}
	hl := int64(newHash().Size())
	// A pack is a 12-byte header and a checksum at least; an index holds
	// the pack's checksum and its own.
	if packSize < 12+hl || idxSize < 2*hl {
		return fmt.Errorf("pack of %d bytes, index of %d: too short", packSize, idxSize)
	}
	// Room for both before a byte is written, as for a push.
	if !diskspace.Enough(quarantine, packSize+idxSize) {
		return fmt.Errorf("pack of %d bytes, index of %d: not enough free disk", packSize, idxSize)
	}
	base := filepath.Join(quarantine, "pack", "pack-"+name)
	packSum, err := receiveFile(body, base+".pack", packSize, hl, newHash(), nil)
	if err != nil {
		return fmt.Errorf("pack: %w", err)
	}
	if hex.EncodeToString(packSum) != name {
		return fmt.Errorf("pack named %s holds checksum %x", name, packSum)
	}
	if _, err := receiveFile(body, base+".idx", idxSize, hl, newHash(), packSum); err != nil {
		return fmt.Errorf("pack index: %w", err)
	}
	if _, err := body.Peek(1); err != io.EOF {
		return errors.New("more after the pack index")
	}
	return nil
}

// receiveFile writes size bytes of r to path and checks that the last hl
// bytes are the hash of the others; with want, that the hl bytes before
// them are want. It returns the checksum.
func receiveFile(r io.Reader, path string, size, hl int64, h hash.Hash, want []byte) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o444)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	body := size - hl
	if want != nil {
		body -= hl
	}
	if _, err := io.CopyN(io.MultiWriter(f, h), r, body); err != nil {
		return nil, fmt.Errorf("cut short: %w", err)
	}
	if want != nil {
		got := make([]byte, hl)
		if _, err := io.ReadFull(r, got); err != nil {
			return nil, fmt.Errorf("cut short: %w", err)
		}
		if !bytes.Equal(got, want) {
			return nil, errors.New("does not describe the pack sent")
		}
		f.Write(got)
		h.Write(got)
	}
	sum := make([]byte, hl)
	if _, err := io.ReadFull(r, sum); err != nil {
		return nil, fmt.Errorf("cut short: %w", err)
	}
	if !bytes.Equal(sum, h.Sum(nil)) {
		return nil, errors.New("checksum mismatch")
	}
	if _, err := f.Write(sum); err != nil {
		return nil, err
	}
	return sum, f.Close()
}
