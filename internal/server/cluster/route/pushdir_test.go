package route

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"packwire/internal/push"
	"packwire/internal/server/cluster"
)

// TestPushDirServesTheNextPush: a push's hooks directory, given back once
// receive-pack exited, serves the next push, its hook link made again
// (the first push's "prepared" call removed it), under another push id;
// nothing is made or removed on a push's path.
func TestPushDirServesTheNextPush(t *testing.T) {
	rt := &Router{HooksDir: t.TempDir()}
	kept := []push.Command{{Ref: "refs/heads/main"}}
	settled := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			rt.mu.Lock()
			k := len(rt.spareDirs)
			rt.mu.Unlock()
			if k == n {
				return
			}
		}
		t.Fatalf("no %d directories kept for the next pushes", n)
	}
	start := func() (id, dir string, done func()) {
		env, config, done := rt.startPush("app", kept, false)
		for _, c := range config {
			dir, _ = strings.CutPrefix(c, "core.hooksPath=")
		}
		for _, e := range env {
			id, _ = strings.CutPrefix(e, cluster.EnvPush+"=")
		}
		if dir == "" || id == "" {
			t.Fatalf("no push directory or id: %v %v", env, config)
		}
		return id, dir, done
	}
	id1, dir1, done := start()
	// The "prepared" call named every ref: the link goes.
	rt.mu.Lock()
	rt.unlinkHook(id1, "app", "key", []cluster.Update{{Ref: "refs/heads/main"}})
	rt.mu.Unlock()
	if _, err := os.Lstat(filepath.Join(dir1, cluster.HookName)); err == nil {
		t.Fatal("the hook link is still there after the prepared call")
	}
	done()
	settled(1)
	id2, dir2, done := start()
	if dir2 != dir1 || id2 == id1 {
		t.Fatalf("the next push got %s as %s; want the first's directory (%s) under another id than %s", dir2, id2, dir1, id1)
	}
	if target, err := os.Readlink(filepath.Join(dir2, cluster.HookName)); err != nil || target != filepath.Join(rt.HooksDir, cluster.HookName) {
		t.Fatalf("the hook link of the next push's directory: %q, %v", target, err)
	}
	done()
	settled(1)
	if dirs, _ := filepath.Glob(filepath.Join(rt.HooksDir, "push-*")); len(dirs) != 1 {
		t.Fatalf("push directories after two pushes in turn: %v, want one", dirs)
	}
}
