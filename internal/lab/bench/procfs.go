package bench

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// These parsers read Linux kernel files; they are portable code so that
// they are tested and fuzzed everywhere.

// procStat is what the bench needs of /proc/PID/stat.
type procStat struct {
	PPID                         int
	UTime, STime, CUTime, CSTime int64 // clock ticks
}

// parseProcStat parses /proc/PID/stat. The command name (field 2) is in
// parentheses and may itself contain spaces and parentheses, so fields are
// counted from the last ')'.
func parseProcStat(s string) (procStat, error) {
	end := strings.LastIndexByte(s, ')')
	if end < 0 {
		return procStat{}, fmt.Errorf("stat: no command name")
	}
	f := strings.Fields(s[end+1:])
	// f[0] is field 3 (state); ppid is field 4, utime..cstime fields 14-17.
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("stat: %d fields after the name, want at least 15", len(f))
	}
	var st procStat
	var err error
	if st.PPID, err = strconv.Atoi(f[1]); err != nil {
		return procStat{}, fmt.Errorf("stat: ppid: %w", err)
	}
	for i, dst := range []*int64{&st.UTime, &st.STime, &st.CUTime, &st.CSTime} {
		if *dst, err = strconv.ParseInt(f[11+i], 10, 64); err != nil || *dst < 0 {
			return procStat{}, fmt.Errorf("stat: field %d: not a tick count: %q", 14+i, f[11+i])
		}
	}
	return st, nil
}

// parseCPUStat reads usage_usec from a cgroup v2 cpu.stat.
func parseCPUStat(s string) (time.Duration, error) {
	for _, line := range strings.Split(s, "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil || n < 0 {
				return 0, fmt.Errorf("cpu.stat: usage_usec %q is not a count", v)
			}
			return time.Duration(n) * time.Microsecond, nil
		}
	}
	return 0, fmt.Errorf("cpu.stat: no usage_usec line")
}

// parseCPUAcctUsage reads a cgroup v1 cpuacct.usage (nanoseconds).
func parseCPUAcctUsage(s string) (time.Duration, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("cpuacct.usage: %q is not a count of nanoseconds", strings.TrimSpace(s))
	}
	return time.Duration(n), nil
}
