package procgroup

import (
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"
)

// TestMain lets the test binary be the child: PROCGROUP_TEST_CHILD=alloc
// touches 64 MiB and exits (so its peak memory is known), =sleep waits to
// be killed.
func TestMain(m *testing.M) {
	switch os.Getenv("PROCGROUP_TEST_CHILD") {
	case "alloc":
		b := make([]byte, 64<<20)
		for i := range b {
			b[i] = byte(i)
		}
		os.Exit(int(b[len(b)-1]) - 255) // 0, and b stays live until here
	case "sleep":
		time.Sleep(5 * time.Minute)
		os.Exit(3)
	}
	os.Exit(m.Run())
}

func child(mode string) *exec.Cmd {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "PROCGROUP_TEST_CHILD="+mode)
	return cmd
}

func TestUsage(t *testing.T) {
	cmd := child("alloc")
	if err := Start(cmd); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	u := UsageOf(cmd.ProcessState)
	if u.UserCPU+u.SysCPU <= 0 {
		t.Errorf("CPU = %v + %v, want > 0 for a process that wrote 64 MiB", u.UserCPU, u.SysCPU)
	}
	if runtime.GOOS == "windows" {
		if u.MaxRSS != 0 {
			t.Errorf("MaxRSS = %d, want 0 (unknown) on Windows", u.MaxRSS)
		}
		return
	}
	// 64 MiB touched: at least that, and nowhere near KiB read as bytes x 1024.
	if u.MaxRSS < 64<<20 || u.MaxRSS > 4<<30 {
		t.Errorf("MaxRSS = %d bytes, want between 64 MiB and 4 GiB", u.MaxRSS)
	}
}

func TestKillEndsChild(t *testing.T) {
	cmd := child("sleep")
	if err := Start(cmd); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	Kill(cmd)
	select {
	case err := <-waited:
		if err == nil || cmd.ProcessState.ExitCode() == 3 {
			t.Fatalf("child ended on its own (%v), not killed", err)
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("child still running 30 s after Kill")
	}
}
