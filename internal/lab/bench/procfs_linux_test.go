package bench

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func selfCPU(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestCgroupReader reads both cgroup formats from directories laid out as
// the kernel does (the machine's own cgroups are not ours to create).
func TestCgroupReader(t *testing.T) {
	v1, v2 := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(v1, "cpuacct.usage"), []byte("2500000000\n"), 0o644)
	os.WriteFile(filepath.Join(v2, "cpu.stat"), []byte("usage_usec 750000\nuser_usec 500000\n"), 0o644)
	for dir, want := range map[string]time.Duration{v1: 2500 * time.Millisecond, v2: 750 * time.Millisecond} {
		r, err := NewCgroupReader(dir)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := r.CPU(); err != nil || got != want {
			t.Fatalf("%s: %v %v, want %v", r, got, err, want)
		}
	}
	if _, err := NewCgroupReader(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no cgroup") {
		t.Fatalf("an empty directory: %v", err)
	}
}

// TestProcessTreeReader measures this test process burning CPU, and a
// child it starts and reaps (counted through cutime).
func TestProcessTreeReader(t *testing.T) {
	r, err := NewProcessTreeReader(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	before, err := r.CPU()
	if err != nil {
		t.Fatal(err)
	}
	// Burn 300 ms of CPU by this process's own account (however loaded
	// the machine is); /proc counts in 10 ms ticks.
	start := selfCPU(t)
	x := 0
	for selfCPU(t)-start < 300*time.Millisecond {
		for i := 0; i < 1e6; i++ {
			x += i
		}
	}
	after, err := r.CPU()
	if err != nil {
		t.Fatal(err)
	}
	if after-before < 250*time.Millisecond {
		t.Fatalf("CPU went from %v to %v after 300 ms of CPU (%d)", before, after, x)
	}
	if _, err := NewProcessTreeReader(1 << 30); err == nil {
		t.Fatal("a process that does not exist was accepted")
	}
}
