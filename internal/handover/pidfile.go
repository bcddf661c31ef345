package handover

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// PIDFile is where a serving packwire writes its pid (DATA/run/packwire.pid):
// packwire upgrade signals it, and sees the next one replace it.
func PIDFile(dataDir string) string { return filepath.Join(dataDir, "run", "packwire.pid") }

// WritePID records this process as the one serving, replacing the file
// in one rename so that a reader never sees it half written.
func WritePID(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := fmt.Sprintf("%s.%d", path, os.Getpid())
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ReadPID returns the pid in path.
func ReadPID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("%s: not a pid: %q", path, strings.TrimSpace(string(b)))
	}
	return pid, nil
}

// RemovePID removes path if it still names this process (after a hand
// over it names the next one, which must keep it).
func RemovePID(path string) {
	if pid, err := ReadPID(path); err == nil && pid == os.Getpid() {
		os.Remove(path)
	}
}
