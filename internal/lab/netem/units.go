package netem

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// rateUnits are the suffixes ParseRate takes, in bytes per second. Bits
// use powers of 1000 as tc does ("10mbit"); bytes say so with "/s".
var rateUnits = []struct {
	suffix string
	bytes  float64
}{
	// Longest suffixes first, so "kbit" is not read as "bit".
	{"kib/s", 1 << 10}, {"mib/s", 1 << 20}, {"gib/s", 1 << 30},
	{"kbit", 1e3 / 8}, {"mbit", 1e6 / 8}, {"gbit", 1e9 / 8},
	{"kb/s", 1e3}, {"mb/s", 1e6}, {"gb/s", 1e9},
	{"bit", 1.0 / 8}, {"b/s", 1},
}

// MaxRate is the largest rate ParseRate takes, 1 TiB/s: far above any link
// the lab shapes, and small enough that a rate survives the float64 of
// FormatRate and ParseRate to the byte (float64 counts exactly to 2^53).
const MaxRate = 1 << 40

// ParseRate reads a bandwidth: a number and a unit, bits per second as tc
// writes them (500kbit, 10mbit, 1gbit) or bytes per second (512KiB/s,
// 1.5MB/s). "0" means unlimited. The result is in bytes per second.
func ParseRate(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	if t == "0" {
		return 0, nil
	}
	for _, u := range rateUnits {
		num, ok := strings.CutSuffix(t, u.suffix)
		if !ok {
			continue
		}
		v, err := parsePositive(num)
		if err != nil {
			return 0, fmt.Errorf("invalid rate %q: %v", s, err)
		}
		b := v * u.bytes
		if b < 1 {
			return 0, fmt.Errorf("invalid rate %q: less than one byte per second", s)
		}
		if b > MaxRate {
			return 0, fmt.Errorf("invalid rate %q: more than 1TiB/s", s)
		}
		return int64(b), nil
	}
	return 0, fmt.Errorf("invalid rate %q: want a number and a unit, e.g. 10mbit, 500kbit, 1gbit, 2MiB/s, 1.5MB/s (0: unlimited)", s)
}

// sizeUnits are the suffixes ParseSize takes.
var sizeUnits = []struct {
	suffix string
	bytes  float64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9},
	{"b", 1},
}

// ParseSize reads a byte count: a whole number of bytes, or a number with a
// unit (64KiB, 1.5MiB, 2MB).
func ParseSize(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := 1.0
	for _, u := range sizeUnits {
		if num, ok := strings.CutSuffix(t, u.suffix); ok {
			t, mult = num, u.bytes
			break
		}
	}
	v, err := parsePositive(t)
	if err != nil {
		return 0, fmt.Errorf("invalid size %q: %v (e.g. 100000, 64KiB, 1.5MiB)", s, err)
	}
	b := v * mult
	if b > math.MaxInt64/2 {
		return 0, fmt.Errorf("invalid size %q: too large", s)
	}
	if b != math.Trunc(b) {
		return 0, fmt.Errorf("invalid size %q: not a whole number of bytes", s)
	}
	return int64(b), nil
}

// parsePositive reads a plain decimal number >= 0 (no sign, exponent,
// hex, infinity or NaN, which ParseFloat would take).
func parsePositive(s string) (float64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, fmt.Errorf("no number")
	}
	dot := false
	for _, r := range s {
		switch {
		case r >= '0' && r <= '9':
		case r == '.' && !dot:
			dot = true
		default:
			return 0, fmt.Errorf("%q is not a number", s)
		}
	}
	if s == "." {
		return 0, fmt.Errorf("%q is not a number", s)
	}
	return strconv.ParseFloat(s, 64)
}

// FormatRate writes bytes per second the way ParseRate reads them.
func FormatRate(bytesPerSecond int64) string {
	if bytesPerSecond <= 0 {
		return "unlimited"
	}
	bits := float64(bytesPerSecond) * 8
	switch {
	case bits >= 1e9:
		return strconv.FormatFloat(bits/1e9, 'f', -1, 64) + "gbit"
	case bits >= 1e6:
		return strconv.FormatFloat(bits/1e6, 'f', -1, 64) + "mbit"
	case bits >= 1e3:
		return strconv.FormatFloat(bits/1e3, 'f', -1, 64) + "kbit"
	}
	return strconv.FormatFloat(bits, 'f', -1, 64) + "bit"
}
