package procgroup

import (
	"os"
	"os/exec"
	"syscall"
	"time"
)

// KillsWholeTree: Kill reaches every process the child started.
const KillsWholeTree = true

// Start starts cmd in its own process group, so that Kill reaches what it
// spawns, and with Pdeathsig, so that a crashed packwire takes it along.
func Start(cmd *exec.Cmd) error {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return cmd.Start()
}

// Kill kills cmd's whole process group at once, pack-objects included.
func Kill(cmd *exec.Cmd) {
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
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
		MaxRSS:  ru.Maxrss * 1024, // Linux counts KiB
	}
}
