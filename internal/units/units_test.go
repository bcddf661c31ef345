package units

import "testing"

func TestBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 36490000: "34.8 MiB", 3 << 30: "3.0 GiB"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"1048576": 1 << 20, "500M": 500 << 20, "2G": 2 << 30, "2GiB": 2 << 30, "64k": 64 << 10, "3 T": 3 << 40, "0": 0} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "M", "-1", "1.5G", "12X", "99999999999T"} {
		if _, err := ParseBytes(bad); err == nil {
			t.Errorf("ParseBytes(%q) took it", bad)
		}
	}
}
