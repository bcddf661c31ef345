package store

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestOpenMakesStorePrivate: a store file an older packwire left 0644
// (with its -wal) is 0600 once opened again. On the old code it stayed 0644.
func TestOpenMakesStorePrivate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "packwire.db")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+"-wal", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(path, 0o644)
	os.Chmod(path+"-wal", 0o644)
	st, err := Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %04o, want 0600", filepath.Base(p), fi.Mode().Perm())
		}
	}
}
