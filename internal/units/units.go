// Package units prints sizes the way every packwire command and page shows
// them, so the CLI, the dashboard and the lab agree to the digit.
package units

import "fmt"

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
