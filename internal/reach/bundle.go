package reach

import (
	"bufio"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"packwire/internal/packidx"
	"path/filepath"
	"strings"

	"packwire/internal/oid"
)

// The clone bundle and the have check. A served clone bundle
// (maintain.BundleFile at /NAME.git/bundle) gives every reader of the
// repository its header's tips and every object of its pack: reads are
// decided per repository, for every transport alike (internal/access has
// no per-ref read rule), the bundle URL is under the same read access as
// a fetch, and the bundle is built from branches, tags and HEAD only
// (never the hidden refs/packwire/). ACKing a have of such an object
// tells the client nothing the bundle does not, so it needs no rev-list.
// That holds only while the bundle is served (Checker.Bundle set) and
// only for what the file served now holds: the header read from it, and
// the pack whose checksum is the file's last bytes (the bundle's pack is
// the preferred pack copied verbatim; its .idx is found by that checksum,
// which names the pack, and checked to record the same checksum).

// bundleObjects is what one version of a repository's bundle file discloses.
type bundleObjects struct {
	fi   os.FileInfo // the file read (same file, size and mtime: same content; it is replaced by rename)
	tips map[string]bool
	idx  *packidx.Index // nil: the pack's .idx is gone or not the bundle's pack
}

func (b *bundleObjects) has(id string) bool {
	return b.tips[id] || b.idx != nil && b.idx.Has(id)
}

// keptBundleBytes bounds the memory of kept bundle indexes (20 bytes an
// object): over it, the kept ones are dropped and read again when asked.
const keptBundleBytes = 256 << 20

// maxBundleHeader bounds the header read (a few hundred bytes a ref).
const maxBundleHeader = 64 << 20

// servedBundle returns the objects of the repository's served clone
// bundle, nil when there is none (or it cannot be read: the haves then go
// to git). The file is opened and stat'ed per call; what it discloses is
// read once per version of it.
func (c *Checker) servedBundle(repoPath string) *bundleObjects {
	if c.Bundle == "" || repoPath == "" {
		return nil
	}
	f, err := os.Open(filepath.Join(repoPath, c.Bundle))
	if err != nil {
		return nil
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil
	}
	c.mu.Lock()
	k := c.bundles[repoPath]
	c.mu.Unlock()
	if k != nil && os.SameFile(k.fi, fi) && k.fi.Size() == fi.Size() && k.fi.ModTime().Equal(fi.ModTime()) {
		return k
	}
	b, err := readBundle(repoPath, f, fi)
	if err != nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bundles == nil {
		c.bundles = map[string]*bundleObjects{}
	}
	if old := c.bundles[repoPath]; old != nil && old.idx != nil {
		c.bundleBytes -= old.idx.Size()
	}
	if b.idx != nil {
		if c.bundleBytes+b.idx.Size() > keptBundleBytes {
			clear(c.bundles)
			c.bundleBytes = 0
		}
		c.bundleBytes += b.idx.Size()
	}
	c.bundles[repoPath] = b
	return b
}

// readBundle reads a v2 bundle's tips (its header's ref lines) and finds
// the index of its pack.
func readBundle(repoPath string, f *os.File, fi os.FileInfo) (*bundleObjects, error) {
	r := bufio.NewReader(io.LimitReader(f, maxBundleHeader))
	if sig, err := r.ReadString('\n'); err != nil || sig != "# v2 git bundle\n" {
		return nil, errors.New("clone bundle: not a v2 bundle")
	}
	b := &bundleObjects{fi: fi, tips: map[string]bool{}}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return nil, errors.New("clone bundle: header not ended")
		}
		if line == "\n" {
			break
		}
		// "<id> <refname>"; a prerequisite ("-<id>") is not in the bundle.
		if id, _, ok := strings.Cut(line, " "); ok && oid.Valid(id) {
			b.tips[id] = true
		}
	}
	var sum [sha1.Size]byte
	if fi.Size() < sha1.Size {
		return b, nil
	}
	if _, err := f.ReadAt(sum[:], fi.Size()-sha1.Size); err != nil {
		return nil, err
	}
	// Without a readable .idx recording the same pack (gone since, or
	// corrupt): the tips alone.
	idx, err := packidx.Read(filepath.Join(repoPath, "objects", "pack", "pack-"+hex.EncodeToString(sum[:])+".idx"))
	if err == nil && idx.Pack == sum {
		b.idx = idx
	}
	return b, nil
}
