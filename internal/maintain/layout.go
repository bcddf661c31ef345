package maintain

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"
)

// Files packwire keeps in a bare repository besides git's own.
const (
	stateFile  = "packwire-maintenance.json" // which pack is preferred and what it covers
	tipsFile   = "packwire-preferred-tips"   // the object ids the preferred pack is the closure of
	lockFile   = "packwire-maintenance.lock" // flock: one maintainer per repository
	keepMarker = "packwire preferred\n"      // content of the preferred pack's .keep
)

// State is what the last full run built.
type State struct {
	Preferred string    `json:"preferred"` // "pack-<hash>.pack"
	Built     time.Time `json:"built"`
	Branches  int       `json:"branches"`
	Tags      int       `json:"tags"`
	Objects   int64     `json:"objects"`
	// TipsDigest is TipsDigest of the tips the preferred pack is the
	// closure of, written in the same file as its name so that the two are
	// read together (the clone fast path, internal/clonepack); empty in
	// files written before it existed.
	TipsDigest string `json:"tips_digest,omitempty"`
}

// TipsDigest names a set of object ids whatever their order or repeats:
// the SHA-256 of the distinct ids, sorted, one a line.
func TipsDigest(tips []string) string {
	sorted := slices.Clone(tips)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	h := sha256.New()
	for _, t := range sorted {
		h.Write([]byte(t))
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// PreferredTips reads the tips the preferred pack is the closure of, as
// the last full run recorded them (nil: none recorded). Check them
// against State.TipsDigest: the two files are written one after another.
func PreferredTips(dir string) ([]string, error) { return readTips(dir) }

// ReadState reads what the last full run recorded in the repository at
// dir (one small file, no git): nil when none was recorded.
func ReadState(dir string) (*State, error) {
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// Pack is one pack file of a repository.
type Pack struct {
	Name      string // "pack-<hash>.pack"
	Size      int64  // bytes of .pack + .idx (+ .rev, .mtimes)
	Objects   int64
	Keep      bool   // has a .keep (preferred, or a push in progress)
	KeepNote  string // content of the .keep
	Cruft     bool   // has .mtimes: unreachable objects kept for the grace period
	Bitmap    bool   // has a single-pack .bitmap (what git gc writes)
	Preferred bool
	ModTime   time.Time
}

// Layout is the object layout of a repository, read from the file system
// without spawning git.
type Layout struct {
	Packs       []Pack
	Loose       int
	MIDX        bool
	MIDXPacks   map[string]bool // "pack-<hash>.pack" names the multi-pack-index covers
	Bitmap      bool            // a multi-pack-index bitmap
	CommitGraph bool
	State       *State
}

// Bytes is the size of all packs.
func (l *Layout) Bytes() int64 {
	var n int64
	for _, p := range l.Packs {
		n += p.Size
	}
	return n
}

// PreferredPack returns the preferred pack if it still exists.
func (l *Layout) PreferredPack() *Pack {
	for i := range l.Packs {
		if l.Packs[i].Preferred {
			return &l.Packs[i]
		}
	}
	return nil
}

// Inspect reads the layout of the bare repository at dir.
func Inspect(dir string) (*Layout, error) {
	packDir := filepath.Join(dir, "objects", "pack")
	l := &Layout{}
	if b, err := os.ReadFile(filepath.Join(dir, stateFile)); err == nil {
		var st State
		if json.Unmarshal(b, &st) == nil {
			l.State = &st
		}
	}
	entries, err := os.ReadDir(packDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	have := map[string]bool{}
	for _, e := range entries {
		have[e.Name()] = true
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, "pack-") || !strings.HasSuffix(name, ".pack") {
			continue
		}
		base := strings.TrimSuffix(name, ".pack")
		if !have[base+".idx"] {
			continue // being written, or left by a killed git: not a pack readers see
		}
		p := Pack{Name: name, Cruft: have[base+".mtimes"], Bitmap: have[base+".bitmap"]}
		for _, ext := range []string{".pack", ".idx", ".rev", ".mtimes"} {
			if fi, err := os.Stat(filepath.Join(packDir, base+ext)); err == nil {
				p.Size += fi.Size()
				if ext == ".pack" {
					p.ModTime = fi.ModTime()
				}
			}
		}
		p.Objects = idxCount(filepath.Join(packDir, base+".idx"))
		if have[base+".keep"] {
			p.Keep = true
			b, _ := os.ReadFile(filepath.Join(packDir, base+".keep"))
			p.KeepNote = string(b)
		}
		p.Preferred = l.State != nil && l.State.Preferred == name && p.KeepNote == keepMarker
		l.Packs = append(l.Packs, p)
	}
	sort.Slice(l.Packs, func(i, j int) bool {
		if l.Packs[i].Preferred != l.Packs[j].Preferred {
			return l.Packs[i].Preferred
		}
		return l.Packs[i].Size > l.Packs[j].Size
	})
	if names, err := midxPacks(filepath.Join(packDir, "multi-pack-index")); err == nil {
		l.MIDX, l.MIDXPacks = true, names
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "multi-pack-index-") && strings.HasSuffix(e.Name(), ".bitmap") {
			l.Bitmap = l.MIDX
		}
	}
	for _, p := range []string{"objects/info/commit-graph", "objects/info/commit-graphs/commit-graph-chain"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err == nil {
			l.CommitGraph = true
		}
	}
	for i := 0; i < 256; i++ {
		sub, err := os.ReadDir(filepath.Join(dir, "objects", hex2(i)))
		if err == nil {
			l.Loose += len(sub)
		}
	}
	return l, nil
}

func hex2(i int) string {
	const digits = "0123456789abcdef"
	return string([]byte{digits[i>>4], digits[i&15]})
}

// idxCount reads the object count of a version 2 pack index (the last
// fan-out entry); -1 if it cannot.
func idxCount(path string) int64 {
	f, err := os.Open(path)
	if err != nil {
		return -1
	}
	defer f.Close()
	var hdr [8 + 256*4]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil {
		return -1
	}
	if !bytes.Equal(hdr[:4], []byte{0xff, 't', 'O', 'c'}) {
		return -1
	}
	return int64(binary.BigEndian.Uint32(hdr[8+255*4:]))
}

// midxPacks reads the pack names (PNAM chunk) of a multi-pack-index.
func midxPacks(path string) (map[string]bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(b) < 12 || string(b[:4]) != "MIDX" {
		return nil, errors.New("not a multi-pack-index")
	}
	chunks := int(b[6])
	for i := 0; i < chunks; i++ {
		at := 12 + 12*i
		if at+24 > len(b) {
			break
		}
		if string(b[at:at+4]) != "PNAM" {
			continue
		}
		start, end := binary.BigEndian.Uint64(b[at+4:]), binary.BigEndian.Uint64(b[at+16:])
		if start > end || end > uint64(len(b)) {
			break
		}
		names := map[string]bool{}
		for _, n := range bytes.Split(b[start:end], []byte{0}) {
			if len(n) > 0 {
				names[strings.TrimSuffix(string(n), ".idx")+".pack"] = true
			}
		}
		return names, nil
	}
	return nil, errors.New("multi-pack-index without pack names")
}
