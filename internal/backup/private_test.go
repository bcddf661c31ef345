//go:build unix

package backup

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"packwire/internal/datadir"
	"packwire/internal/governor"
	"packwire/internal/store"
)

// TestPrivateFiles: under the usual umask (022), everything in DATA that
// holds secrets is its owner's alone: the data directory 0700; the store
// (webhook secrets, token hashes) and the request records 0600 with their
// -wal and -shm files; the host keys 0600; a backup 0700 with its
// databases 0600, and a data directory restored from it 0700. On the old
// code packwire.db, governor.db and their -wal and -shm were 0644 and DATA
// 0755.
func TestPrivateFiles(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "data")
	data, err := datadir.Create(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer data.Close()
	if _, err := data.HostKeys(); err != nil {
		t.Fatal(err)
	}
	gov, err := governor.OpenIn(ctx, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	defer gov.Close()
	ctx = store.WithActor(ctx, "cli:test")
	if _, err := data.Store.AddHook(ctx, store.Hook{RepoPattern: "**", URL: "https://ci.example/h", Secret: "s3cret", Events: []string{"push"}}); err != nil {
		t.Fatal(err)
	}
	want := map[string]os.FileMode{
		".": 0o700, "packwire.db": 0o600, "packwire.db-wal": 0o600, "packwire.db-shm": 0o600,
		"governor.db": 0o600, "governor.db-wal": 0o600, "governor.db-shm": 0o600,
		"ssh_host_ed25519_key": 0o600, "ssh_host_ecdsa_key": 0o600, "ssh_host_rsa_key": 0o600,
	}
	checkModes(t, dir, want)

	out := filepath.Join(t.TempDir(), "backup")
	if _, _, err := Create(ctx, dir, out, Options{Governor: true}); err != nil {
		t.Fatal(err)
	}
	checkModes(t, out, map[string]os.FileMode{".": 0o700, "packwire.db": 0o600, "governor.db": 0o600, "ssh_host_ed25519_key": 0o600})
	restored := filepath.Join(t.TempDir(), "restored")
	if _, _, err := Restore(ctx, out, restored, Options{}); err != nil {
		t.Fatal(err)
	}
	checkModes(t, restored, map[string]os.FileMode{".": 0o700, "packwire.db": 0o600, "ssh_host_ed25519_key": 0o600})
}

func checkModes(t *testing.T, dir string, want map[string]os.FileMode) {
	t.Helper()
	for name, mode := range want {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if got := fi.Mode().Perm(); got != mode {
			t.Errorf("%s in %s: mode %04o, want %04o", name, dir, got, mode)
		}
	}
}
