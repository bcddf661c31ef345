//go:build unix

package procgroup

import (
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"
)

// KillsWholeTree: Kill reaches every process the child started.
const KillsWholeTree = true

// Start starts cmd in its own process group, so that Kill reaches what it
// spawns; on Linux also with Pdeathsig, so that a crashed packwire takes it
// along (elsewhere children of a crashed packwire run on until git notices
// its closed pipes).
func Start(cmd *exec.Cmd) error {
	cmd.SysProcAttr = sysProcAttr()
	return cmd.Start()
}

// Kill kills cmd's whole process group at once, pack-objects included.
func Kill(cmd *exec.Cmd) {
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
}

// Terminate asks cmd's whole process group to stop (SIGTERM), so that git
// can clean up after itself (receive-pack removes its push quarantine on
// SIGTERM; a SIGKILL leaves it on disk).
func Terminate(cmd *exec.Cmd) {
	syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
}

// UsageOf reads rusage, which includes the children the process waited for.
func UsageOf(st *os.ProcessState) Usage {
	ru, ok := st.SysUsage().(*syscall.Rusage)
	if !ok {
		return Usage{}
	}
	return Usage{
		UserCPU: time.Duration(ru.Utime.Nano()),
		SysCPU:  time.Duration(ru.Stime.Nano()),
		MaxRSS:  maxRSSBytes(int64(ru.Maxrss)),
	}
}

// maxRSSBytes converts ru_maxrss, which macOS counts in bytes and Linux and
// the BSDs in KiB.
func maxRSSBytes(v int64) int64 {
	if runtime.GOOS == "darwin" || runtime.GOOS == "ios" {
		return v
	}
	return v * 1024
}
