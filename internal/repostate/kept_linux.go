package repostate

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// Kept stamps (Refs): every directory a stamp covers (the repository's
// own, objects, objects/info, objects/pack, refs and each directory below
// it) is watched with inotify before it is read. inotify queues an event
// inside the system call that changes a directory or a file in it (a
// rename over a ref, a new pack, a rewritten packed-refs or config), so a
// request that arrives after a push returned finds the push's event in
// the queue: each call reads the queue first, and a stamp is reused only
// while no event touched its repository since its walk began. Global
// config files lie elsewhere and are compared by lstat on each call.
// File systems where another machine may change the files (NFS, FUSE, ...)
// are never kept: only those in localFileSystems are. Nor are repositories
// past the watch budget (half of fs.inotify.max_user_watches), which are
// walked on every call as before.

// watchMask is every change to a directory's entries or to a file in it.
const watchMask = entriesMask | syscall.IN_MODIFY | syscall.IN_CLOSE_WRITE

// entriesMask is every change to a directory's entries (and to its own or
// its files' attributes). It is all objects/pack is watched for: the
// stamp covers that directory's entries only, and a pack being written
// there (a push, a repack) would otherwise queue an event per write and
// overflow the queue, which drops every kept stamp.
const entriesMask = syscall.IN_CREATE | syscall.IN_DELETE | syscall.IN_MOVED_FROM | syscall.IN_MOVED_TO |
	syscall.IN_ATTRIB | syscall.IN_DELETE_SELF | syscall.IN_MOVE_SELF | syscall.IN_ONLYDIR

// errForgotten ends the walk of a stamp evicted meanwhile: its watches
// would belong to nothing.
var errForgotten = errors.New("kept stamp evicted during its walk")

// keptLimit bounds the repositories whose stamps are kept (and watched).
const keptLimit = 1024

// localFileSystems are the statfs magic numbers of file systems that only
// this kernel changes, so that inotify sees every change.
var localFileSystems = map[int64]bool{
	0xEF53:     true, // ext2/3/4
	0x58465342: true, // xfs
	0x9123683E: true, // btrfs
	0x01021994: true, // tmpfs
	0x794c7630: true, // overlayfs
	0x2fc12fc1: true, // zfs
	0xF2F52010: true, // f2fs
}

type keptStamp struct {
	walk    sync.Mutex         // one walk of the repository at a time
	wds     map[int32]struct{} // its watches (those of directories gone are dropped)
	gone    bool               // evicted (forgetLocked): holds no watches any more
	changes uint64             // events seen for it (or for everything)
	valid   bool               // stamp is current unless changes moved since
	stamp   Stamp
	newest  time.Time
	globals string // globalsStat at the walk
	// dir is the repository directory's device and inode at the walk:
	// inotify does not see a parent renamed and another repository put
	// at the same path, which this does (one lstat per call).
	dir [2]uint64
	// unwatched: walked on every call (not a local file system, or out
	// of watches).
	unwatched bool
}

var kept struct {
	once     sync.Once
	fd       int // -1: inotify unavailable, every call walks
	budget   int // watches this process may hold: half the user's limit
	mu       sync.Mutex
	repos    map[string]*keptStamp
	byWatch  map[int32]*keptStamp
	overflow uint64 // queue overflows: every stamp is suspect
	buf      [64 << 10]byte
}

func keptRefs(repoPath string, now time.Time) (Stamp, error) {
	kept.once.Do(func() {
		fd, err := syscall.InotifyInit1(syscall.IN_NONBLOCK | syscall.IN_CLOEXEC)
		if err != nil {
			fd = -1
		}
		kept.fd = fd
		kept.repos, kept.byWatch = map[string]*keptStamp{}, map[int32]*keptStamp{}
		// The limit is per user: leave half of it to other programs.
		kept.budget = 4096
		if b, err := os.ReadFile("/proc/sys/fs/inotify/max_user_watches"); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 {
				kept.budget = n / 2
			}
		}
	})
	if kept.fd < 0 {
		st, _, err := walkRefs(repoPath, now, nil)
		return st, err
	}
	kept.mu.Lock()
	drainLocked()
	k := kept.repos[repoPath]
	if k == nil {
		if len(kept.repos) >= keptLimit {
			for path, old := range kept.repos {
				forgetLocked(path, old)
				break
			}
		}
		k = &keptStamp{unwatched: len(kept.byWatch) >= kept.budget || !localFileSystem(repoPath)}
		kept.repos[repoPath] = k
	}
	unwatched := k.unwatched
	kept.mu.Unlock()
	if unwatched {
		st, _, err := walkRefs(repoPath, now, nil)
		return st, err
	}

	k.walk.Lock()
	defer k.walk.Unlock()
	globals := globalsStat()
	dir := dirID(repoPath)
	kept.mu.Lock()
	drainLocked()
	if k.valid && k.globals == globals && k.dir == dir {
		st := k.stamp
		st.Racy = racy(k.newest, now)
		kept.mu.Unlock()
		return st, nil
	}
	k.valid = false
	changes := k.changes + kept.overflow
	kept.mu.Unlock()

	packDir := filepath.Join(repoPath, "objects", "pack")
	st, newest, err := walkRefs(repoPath, now, func(dir string) error {
		kept.mu.Lock()
		switch {
		case k.gone:
			kept.mu.Unlock()
			return errForgotten
		case len(kept.byWatch) >= kept.budget:
			// The budget holds during a walk too: one repository with
			// thousands of ref directories must not take every watch.
			kept.mu.Unlock()
			return syscall.ENOSPC
		}
		kept.mu.Unlock()
		mask := uint32(watchMask)
		if dir == packDir {
			mask = entriesMask
		}
		wd, err := syscall.InotifyAddWatch(kept.fd, dir, mask)
		if err != nil {
			return err
		}
		kept.mu.Lock()
		defer kept.mu.Unlock()
		owner := kept.byWatch[int32(wd)]
		if k.gone {
			if owner == nil {
				syscall.InotifyRmWatch(kept.fd, uint32(wd))
			}
			return errForgotten
		}
		if owner != k {
			if owner != nil {
				delete(owner.wds, int32(wd))
			}
			kept.byWatch[int32(wd)] = k
			if k.wds == nil {
				k.wds = map[int32]struct{}{}
			}
			k.wds[int32(wd)] = struct{}{}
		}
		return nil
	})
	switch {
	case errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.ENOMEM):
		// Out of watches: this repository is walked on every call.
		kept.mu.Lock()
		if kept.repos[repoPath] == k {
			forgetLocked(repoPath, k)
			kept.repos[repoPath] = &keptStamp{unwatched: true}
		}
		kept.mu.Unlock()
		st, _, err = walkRefs(repoPath, now, nil)
	case errors.Is(err, errForgotten):
		st, _, err = walkRefs(repoPath, now, nil)
	}
	if err != nil {
		return st, err
	}
	kept.mu.Lock()
	drainLocked()
	// Kept only if nothing changed since the watches were set: an event
	// during the walk may have been read half-way.
	if k.changes+kept.overflow == changes {
		k.valid, k.stamp, k.newest, k.globals, k.dir = true, st, newest, globals, dir
	}
	kept.mu.Unlock()
	return st, nil
}

// drainLocked reads every queued event and marks the repositories they
// touch as changed.
func drainLocked() {
	for {
		n, err := syscall.Read(kept.fd, kept.buf[:])
		if err == syscall.EINTR {
			continue
		}
		if n <= 0 || err != nil {
			return // EAGAIN: the queue is empty
		}
		for off := 0; off+syscall.SizeofInotifyEvent <= n; {
			ev := (*syscall.InotifyEvent)(unsafe.Pointer(&kept.buf[off]))
			off += syscall.SizeofInotifyEvent + int(ev.Len)
			if ev.Mask&syscall.IN_Q_OVERFLOW != 0 {
				kept.overflow++
				for _, k := range kept.repos {
					k.valid = false
				}
				continue
			}
			k := kept.byWatch[ev.Wd]
			if k == nil {
				continue
			}
			k.changes++
			k.valid = false
			if ev.Mask&syscall.IN_IGNORED != 0 {
				// The directory is gone (or unwatched): its watch id may be reused.
				delete(kept.byWatch, ev.Wd)
				delete(k.wds, ev.Wd)
			}
		}
	}
}

// forgetLocked stops watching a repository. A walk of it in progress
// adds no watch from then on (gone).
func forgetLocked(path string, k *keptStamp) {
	for wd := range k.wds {
		if kept.byWatch[wd] == k {
			syscall.InotifyRmWatch(kept.fd, uint32(wd))
			delete(kept.byWatch, wd)
		}
	}
	k.wds = nil
	k.valid, k.gone = false, true
	if kept.repos[path] == k {
		delete(kept.repos, path)
	}
}

func localFileSystem(path string) bool {
	var fs syscall.Statfs_t
	if err := syscall.Statfs(path, &fs); err != nil {
		return false
	}
	return localFileSystems[int64(fs.Type)]
}

// dirID is a directory's device and inode ({0, 0}: unreadable).
func dirID(path string) [2]uint64 {
	var st syscall.Stat_t
	if syscall.Lstat(path, &st) != nil {
		return [2]uint64{}
	}
	return [2]uint64{uint64(st.Dev), st.Ino}
}
