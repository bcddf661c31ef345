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

// TestPushDirMadeAhead: a push's hooks directory is removed after the
// push, and the next push's made meanwhile, both in the background: the
// next push finds its directory, with the hook's link, made.
func TestPushDirMadeAhead(t *testing.T) {
	rt := &Router{HooksDir: t.TempDir()}
	kept := []push.Command{{Ref: "refs/heads/main"}}
	hooksPath := func(config []string) string {
		for _, c := range config {
			if dir, ok := strings.CutPrefix(c, "core.hooksPath="); ok {
				return dir
			}
		}
		t.Fatalf("no hooks directory in %v", config)
		return ""
	}
	_, config, done := rt.startPush("app", kept, false)
	first := hooksPath(config)
	done()
	var ahead []string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		rt.mu.Lock()
		n := len(rt.spareDirs)
		rt.mu.Unlock()
		ahead, _ = filepath.Glob(filepath.Join(rt.HooksDir, "push-*"))
		if n == 1 && len(ahead) == 1 && ahead[0] != first {
			break
		}
	}
	if len(ahead) != 1 || ahead[0] == first {
		t.Fatalf("after a push, its directory and one made ahead: %v (the push's was %s)", ahead, first)
	}
	_, config, done = rt.startPush("app", kept, false)
	defer func() {
		// The background work done before the test's directory goes.
		done()
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			rt.mu.Lock()
			n := len(rt.spareDirs)
			rt.mu.Unlock()
			if n == 1 {
				return
			}
		}
	}()
	if next := hooksPath(config); next != ahead[0] {
		t.Fatalf("the next push's directory is %s, not the one made ahead (%s)", next, ahead[0])
	}
	if target, err := os.Readlink(filepath.Join(ahead[0], cluster.HookName)); err != nil || target != filepath.Join(rt.HooksDir, cluster.HookName) {
		t.Fatalf("the hook's link in the directory made ahead: %q, %v", target, err)
	}
}
