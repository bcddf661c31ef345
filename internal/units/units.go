// Package units prints sizes the way every packwire command and page shows
// them, so the CLI, the dashboard and the lab agree to the digit.
package units

import (
	"fmt"
	"strconv"
	"strings"
)

// Bytes is a byte count in binary units: 512 B, 1.5 KiB, 34.8 MiB, 2.0 GiB.
func Bytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// ParseBytes reads a byte count: a number, optionally followed by K, M, G
// or T (binary: 1K = 1024), with or without "iB"/"B" ("500M", "2GiB",
// "1048576").
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "i")
	shift := 0
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K', 'k':
			shift = 10
		case 'M', 'm':
			shift = 20
		case 'G', 'g':
			shift = 30
		case 'T', 't':
			shift = 40
		}
		if shift > 0 {
			t = t[:n-1]
		}
	}
	v, err := strconv.ParseInt(strings.TrimSpace(t), 10, 64)
	if err != nil || v < 0 || v > (1<<62)>>shift {
		return 0, fmt.Errorf("%q is not a size (a byte count like 1048576, 500M or 2G)", s)
	}
	return v << shift, nil
}
