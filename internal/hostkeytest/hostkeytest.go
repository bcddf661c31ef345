// Package hostkeytest gives the data directories of tests the SSH host
// keys generated once per test binary: generating an RSA-3072 key costs
// about 0.4 s of CPU, and the end-to-end tests start a hundred-odd SSH
// servers. The tests of key generation itself (internal/datadir,
// TestSSHHostKeys) do not use it.
package hostkeytest

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"packwire/internal/datadir"
)

// keys are the shared keys' files by name, read into memory from a
// temporary data directory removed at once.
var (
	once sync.Once
	keys map[string][]byte
)

// Copy writes the shared host keys into dataDir (created if missing), as
// the server would have generated them on its first start.
func Copy(t testing.TB, dataDir string) {
	t.Helper()
	once.Do(func() { keys = generate(t) })
	if len(keys) == 0 {
		t.Fatal("the shared host keys failed to generate (see the first test that used them)")
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, b := range keys {
		if err := os.WriteFile(filepath.Join(dataDir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func generate(t testing.TB) map[string][]byte {
	dir, err := os.MkdirTemp("", "packwire-hostkeys-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	data, err := datadir.Create(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	defer data.Close()
	if _, err := data.HostKeys(); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "ssh_host_*"))
	out := map[string][]byte{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[filepath.Base(f)] = b
	}
	return out
}
