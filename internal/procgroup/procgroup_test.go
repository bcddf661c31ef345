//go:build unix

package procgroup

import (
	"os"
	"os/exec"
	"testing"
)

// TestMain lets the test binary be the child: PROCGROUP_TEST_ALLOC makes it
// touch that many MiB and exit, so its peak memory is known.
func TestMain(m *testing.M) {
	if os.Getenv("PROCGROUP_TEST_ALLOC") == "64" {
		b := make([]byte, 64<<20)
		for i := range b {
			b[i] = byte(i)
		}
		os.Exit(int(b[len(b)-1]) - 255) // 0, and b stays live until here
	}
	os.Exit(m.Run())
}

func TestUsageInBytes(t *testing.T) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "PROCGROUP_TEST_ALLOC=64")
	if err := Start(cmd); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	u := UsageOf(cmd.ProcessState)
	// 64 MiB touched: at least that, and nowhere near KiB read as bytes x 1024.
	if u.MaxRSS < 64<<20 || u.MaxRSS > 4<<30 {
		t.Errorf("MaxRSS = %d bytes, want between 64 MiB and 4 GiB", u.MaxRSS)
	}
	if u.UserCPU+u.SysCPU <= 0 {
		t.Errorf("CPU = %v + %v, want > 0 for a process that wrote 64 MiB", u.UserCPU, u.SysCPU)
	}
}
