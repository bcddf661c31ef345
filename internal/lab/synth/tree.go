package synth

import (
	"crypto/sha1"
	"encoding/binary"
	"slices"
	"strconv"
)

// Git file modes as fast-import and tree objects write them.
const (
	modeDir  = 0o40000
	modeFile = 0o100644
	modeExec = 0o100755
	modeLink = 0o120000
)

// node is an entry of a persistent tree: every branch holds a root, and a
// change copies only the directories on its path (the others are shared),
// so branches are cheap and each directory knows its git object id. That
// lets the generator count exactly the trees and blobs git will store,
// and steer the history towards the study's counts while it writes it.
type node struct {
	name string
	mode uint32
	kids []*node   // directories: entries in git's tree order
	text *fileText // regular files: the content model (nil for symlinks)
	size int
	oid  [20]byte
	open bool // a directory changed in the current commit, not hashed yet
}

func (n *node) isDir() bool { return n.mode == modeDir }

// gitLess orders tree entries as git does: by name, a directory's name
// compared as if it ended in '/'.
func gitLess(aName string, aDir bool, bName string, bDir bool) int {
	n := min(len(aName), len(bName))
	for i := range n {
		if aName[i] != bName[i] {
			return int(aName[i]) - int(bName[i])
		}
	}
	ac, bc := 0, 0
	if len(aName) > n {
		ac = int(aName[n])
	} else if aDir {
		ac = '/'
	}
	if len(bName) > n {
		bc = int(bName[n])
	} else if bDir {
		bc = '/'
	}
	return ac - bc
}

// find returns the index of the entry called name (a directory if dir) in
// dir's entries, or where it would go.
func find(kids []*node, name string, dir bool) (int, bool) {
	return slices.BinarySearchFunc(kids, name, func(k *node, name string) int {
		return gitLess(k.name, k.isDir(), name, dir)
	})
}

// lookup returns the entry at path below root, or nil.
func lookup(root *node, path []string) *node {
	n := root
	for i, part := range path {
		if n == nil || !n.isDir() {
			return nil
		}
		leaf := i == len(path)-1
		j, ok := find(n.kids, part, !leaf)
		if !ok && leaf {
			j, ok = find(n.kids, part, true)
		}
		if !ok {
			return nil
		}
		n = n.kids[j]
	}
	return n
}

// opened returns a directory that the current commit may change in place:
// dir itself if already opened by this commit, otherwise a copy.
func opened(dir *node) *node {
	if dir.open {
		return dir
	}
	c := *dir
	c.kids = slices.Clone(dir.kids)
	c.open = true
	return &c
}

// setPath puts leaf at path below dir and returns the new dir.
func setPath(dir *node, path []string, leaf *node) *node {
	dir = opened(dir)
	if len(path) == 1 {
		i, ok := find(dir.kids, path[0], leaf.isDir())
		if ok {
			dir.kids[i] = leaf
		} else {
			dir.kids = slices.Insert(dir.kids, i, leaf)
		}
		return dir
	}
	i, ok := find(dir.kids, path[0], true)
	if ok {
		dir.kids[i] = setPath(dir.kids[i], path[1:], leaf)
	} else {
		dir.kids = slices.Insert(dir.kids, i, setPath(&node{name: path[0], mode: modeDir, open: true}, path[1:], leaf))
	}
	return dir
}

// deletePath removes the file at path below dir. It returns the new dir,
// or nil when dir became empty (git has no empty trees).
func deletePath(dir *node, path []string) *node {
	leaf := len(path) == 1
	i, ok := find(dir.kids, path[0], !leaf)
	if !ok {
		return dir
	}
	dir = opened(dir)
	if leaf {
		dir.kids = slices.Delete(dir.kids, i, i+1)
	} else if sub := deletePath(dir.kids[i], path[1:]); sub == nil {
		dir.kids = slices.Delete(dir.kids, i, i+1)
	} else {
		dir.kids[i] = sub
	}
	if len(dir.kids) == 0 {
		return nil
	}
	return dir
}

// objectSet remembers which objects exist, by the first 8 bytes of their
// id (a collision among a few million ids is out of reach).
type objectSet map[uint64]struct{}

// add reports whether oid is new.
func (s objectSet) add(oid [20]byte) bool {
	k := binary.LittleEndian.Uint64(oid[:8])
	if _, ok := s[k]; ok {
		return false
	}
	s[k] = struct{}{}
	return true
}

// hasher computes git object ids of trees and blobs.
type hasher struct{ buf []byte }

// seal hashes the directories the current commit opened, bottom up, and
// returns how many of them are trees git did not have yet.
func (h *hasher) seal(dir *node, seen objectSet) int {
	if !dir.open {
		return 0
	}
	created := 0
	for _, k := range dir.kids {
		if k.open {
			created += h.seal(k, seen)
		}
	}
	body := h.buf[:0]
	for _, k := range dir.kids {
		body = strconv.AppendUint(body, uint64(k.mode), 8)
		body = append(body, ' ')
		body = append(body, k.name...)
		body = append(body, 0)
		body = append(body, k.oid[:]...)
	}
	h.buf = body
	dir.oid = objectID("tree", body)
	dir.open = false
	if seen.add(dir.oid) {
		created++
	}
	return created
}

// objectID is git's SHA-1 object id of an object of type kind.
func objectID(kind string, body []byte) [20]byte {
	d := sha1.New()
	var hdr [32]byte
	h := append(hdr[:0], kind...)
	h = append(h, ' ')
	h = strconv.AppendInt(h, int64(len(body)), 10)
	h = append(h, 0)
	d.Write(h)
	d.Write(body)
	var oid [20]byte
	d.Sum(oid[:0])
	return oid
}
