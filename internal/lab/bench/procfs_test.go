package bench

import (
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	// A command name with spaces and parentheses: fields count from the last ')'.
	line := "4242 (evil) name (x)) S 17 4242 4242 0 -1 4194560 500 0 0 0 250 31 7 3 20 0 1 0 100 1000 100 0 0\n"
	st, err := parseProcStat(line)
	if err != nil {
		t.Fatal(err)
	}
	if st.PPID != 17 || st.UTime != 250 || st.STime != 31 || st.CUTime != 7 || st.CSTime != 3 {
		t.Fatalf("%+v", st)
	}
	for _, bad := range []string{"", "1 (x S 1", "1 (x) S 1 2 3", "1 (x) S p 1 1 0 -1 0 0 0 0 0 1 1 1 1 20", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 -1 1 1 1 20"} {
		if _, err := parseProcStat(bad); err == nil {
			t.Errorf("parseProcStat(%q): no error", bad)
		}
	}
}

func TestParseCgroupFiles(t *testing.T) {
	if d, err := parseCPUStat("usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n"); err != nil || d != 1500*time.Microsecond {
		t.Fatalf("cpu.stat: %v %v", d, err)
	}
	if d, err := parseCPUAcctUsage("123456789\n"); err != nil || d != 123456789 {
		t.Fatalf("cpuacct.usage: %v %v", d, err)
	}
	for _, bad := range []string{"", "user_usec 5\n", "usage_usec x\n", "usage_usec -1\n"} {
		if _, err := parseCPUStat(bad); err == nil {
			t.Errorf("parseCPUStat(%q): no error", bad)
		}
	}
	if _, err := parseCPUAcctUsage("12 34"); err == nil {
		t.Error("parseCPUAcctUsage accepted two numbers")
	}
}

func FuzzParseProcStat(f *testing.F) {
	f.Add("1 (init) S 0 1 1 0 -1 4194560 1 0 0 0 5 6 7 8 20 0 1 0 1 1 1")
	f.Add("2 (a) b)) R 1 2 2 0 -1 0 0 0 0 0 1 1 1 1 20")
	f.Fuzz(func(t *testing.T, s string) {
		st, err := parseProcStat(s)
		if err == nil && (st.UTime < 0 || st.STime < 0 || st.CUTime < 0 || st.CSTime < 0) {
			t.Fatalf("negative ticks accepted: %+v", st)
		}
		parseCPUStat(s)
		parseCPUAcctUsage(s)
	})
}
