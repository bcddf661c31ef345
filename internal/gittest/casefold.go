package gittest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"packwire/internal/needs"
)

// CaseInsensitiveDir returns an empty directory on a file system that folds
// case, as macOS and Windows do by default: the test's temporary directory
// where it already does, else (Linux, as root) an exFAT image mounted
// through FUSE on a loop device, unmounted at the test's end. Where neither
// can be had the test fails saying why (needs.Missing: it skips with
// PACKWIRE_TEST_ALLOW_SKIP=1); exfatprogs and exfat-fuse come with
// scripts/install-deps.
func CaseInsensitiveDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if folds(t, dir) {
		return dir
	}
	skip := func(why string) {
		t.Helper()
		needs.Missing(t, "no case-insensitive file system to test on: %s", why)
	}
	if os.Geteuid() != 0 {
		skip("mounting exFAT needs root")
	}
	for _, tool := range []string{"mkfs.exfat", "mount.exfat-fuse", "losetup", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			skip(tool + " not found (apt-get install exfatprogs exfat-fuse)")
		}
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		skip("no /dev/fuse")
	}
	run := func(name string, args ...string) (string, bool) {
		out, err := exec.Command(name, args...).CombinedOutput()
		return strings.TrimSpace(string(out)), err == nil
	}
	img := filepath.Join(dir, "exfat.img")
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if f, err := os.Create(img); err != nil || f.Truncate(64<<20) != nil || f.Close() != nil {
		t.Fatalf("image: %v", err)
	}
	if out, ok := run("mkfs.exfat", img); !ok {
		skip("mkfs.exfat: " + out)
	}
	// exfat-fuse as root mounts a block device only (fuseblk).
	dev, ok := run("losetup", "--find", "--show", img)
	if !ok {
		skip("losetup: " + dev)
	}
	if out, ok := run("mount.exfat-fuse", dev, mnt); !ok {
		run("losetup", "--detach", dev)
		skip("mount.exfat-fuse: " + out)
	}
	t.Cleanup(func() {
		// FUSE may still be busy a moment after the last file closed.
		for i := 0; ; i++ {
			out, ok := run("umount", mnt)
			if ok || i == 50 {
				if !ok {
					t.Errorf("umount %s: %s", mnt, out)
				}
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if out, ok := run("losetup", "--detach", dev); !ok {
			t.Errorf("losetup --detach %s: %s", dev, out)
		}
	})
	if !folds(t, mnt) {
		t.Fatalf("exFAT at %s does not fold case", mnt)
	}
	return mnt
}

// folds reports whether dir's file system finds a file under another case.
func folds(t testing.TB, dir string) bool {
	t.Helper()
	probe := filepath.Join(dir, "case-probe")
	if err := os.WriteFile(probe, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(probe)
	_, err := os.Lstat(filepath.Join(dir, "CASE-PROBE"))
	return err == nil
}
