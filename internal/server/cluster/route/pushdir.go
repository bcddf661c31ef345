package route

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"

	"packwire/internal/push"
	"packwire/internal/server/cluster"
)

// git runs the reference-transaction hook twice for every transaction it
// commits: "prepared", where the server replicates the push, and
// "committed", which only told the server that git wrote the primary's
// refs. That second start of the hook is on every push's path (git waits
// for it before its report). So a push whose every ref is in one
// transaction (an atomic push, or a push of one ref: git 2.39 gives a
// non-atomic push one transaction per ref) gets a hooks directory of its
// own, whose hook link the server removes while it answers "prepared":
// git looks the hook up again for "committed" (or "aborted") and finds
// none. The server learns instead from the pipeline that receive-pack has
// exited, and records its copy once the refs on disk are the
// generation's; until then that copy is stale, as before the "committed" call.
// (recordOwn: its refs' digest is the generation's.)

// livePush is a push on this primary with a hooks directory of its own.
type livePush struct {
	repo string
	dir  string
	refs map[string]bool // every ref the push gives receive-pack
	// Once its "prepared" call named every ref and the hook was unlinked:
	// the pending entry to record at the end, and the updates to find on
	// disk first.
	unlinked bool
	key      string
}

// startPush is pipeline.Route.Push for a push to name on this primary.
func (rt *Router) startPush(name string, kept []push.Command, guarded bool) (env, config []string, done func()) {
	// Through pushguard's proc-receive, git runs more transactions than
	// the commands say: the shared directory, and git's every call.
	if guarded || len(kept) == 0 {
		return nil, nil, func() {}
	}
	dir, err := rt.takeDir()
	if err != nil {
		return nil, nil, func() {}
	}
	lp := &livePush{repo: name, dir: dir, refs: map[string]bool{}}
	for _, c := range kept {
		lp.refs[c.Ref] = true
	}
	// The push's id, not its directory's name: a directory serves one
	// push after another.
	b := make([]byte, 12)
	rand.Read(b)
	id := hex.EncodeToString(b)
	rt.mu.Lock()
	if rt.pushes == nil {
		rt.pushes = map[string]*livePush{}
	}
	rt.pushes[id] = lp
	rt.mu.Unlock()
	done = func() {
		rt.mu.Lock()
		delete(rt.pushes, id)
		var p pendingPush
		ok := false
		if lp.unlinked {
			if p, ok = rt.pending[lp.key]; ok {
				delete(rt.pending, lp.key)
			}
		}
		rt.mu.Unlock()
		rt.dropDir(dir)
		if ok {
			rt.recordOwn(name, p)
		}
	}
	return []string{cluster.EnvPush + "=" + id}, []string{"core.hooksPath=" + dir}, done
}

// spareDirs is how many push directories are kept for the next pushes.
const spareDirs = 2

// takeDir returns a push directory with its hook link: one a push before
// used if there is one, else a new one. Making a directory and a link,
// and removing them, took a few hundred microseconds of CPU each on this
// machine's disk: on every push's path, before git started and before
// its report.
func (rt *Router) takeDir() (string, error) {
	rt.mu.Lock()
	if n := len(rt.spareDirs); n > 0 {
		dir := rt.spareDirs[n-1]
		rt.spareDirs = rt.spareDirs[:n-1]
		rt.mu.Unlock()
		return dir, nil
	}
	rt.mu.Unlock()
	dir, err := os.MkdirTemp(rt.HooksDir, "push-")
	if err != nil {
		return "", err
	}
	if err := os.Symlink(rt.hookLinkTarget(), filepath.Join(dir, cluster.HookName)); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

func (rt *Router) hookLinkTarget() string { return filepath.Join(rt.HooksDir, cluster.HookName) }

// dropDir gives back a push's directory once receive-pack has exited, in
// the background, off the push's answer: its hook link made again if the
// push removed it, it serves a next push (a few are kept; the others are
// removed). Those left when the server stops are removed at its next
// start (InstallHooks).
func (rt *Router) dropDir(dir string) {
	go func() {
		link := filepath.Join(dir, cluster.HookName)
		if target, err := os.Readlink(link); err != nil || target != rt.hookLinkTarget() {
			os.Remove(link)
			if err := os.Symlink(rt.hookLinkTarget(), link); err != nil {
				os.RemoveAll(dir)
				return
			}
		}
		rt.mu.Lock()
		kept := len(rt.spareDirs) < spareDirs
		if kept {
			rt.spareDirs = append(rt.spareDirs, dir)
		}
		rt.mu.Unlock()
		if !kept {
			os.RemoveAll(dir)
		}
	}()
}

// unlinkHook is called under rt.mu as a "prepared" call of the push id
// is answered: when it names every ref of the push, git runs no other
// transaction for it, and the hook is removed so that git starts it no
// more. key is the call's pending entry (set when the push succeeded).
func (rt *Router) unlinkHook(id, repoName, key string, updates []cluster.Update) {
	lp := rt.pushes[id]
	if lp == nil || lp.repo != repoName || lp.unlinked {
		return
	}
	named := map[string]bool{}
	for _, u := range updates {
		named[u.Ref] = true
	}
	for ref := range lp.refs {
		if !named[ref] {
			return
		}
	}
	if err := os.Remove(filepath.Join(lp.dir, cluster.HookName)); err != nil {
		return // git calls again, as for any push
	}
	lp.unlinked, lp.key = true, key
}
