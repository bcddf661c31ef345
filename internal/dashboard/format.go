package dashboard

import (
	"fmt"
	"time"

	"packwire/internal/units"
)

// bytesText is a byte count in binary units, as the CLI prints them.
func bytesText(n int64) string {
	return units.Bytes(n)
}

// durationText rounds to what a reader can take in: 3 significant figures.
func durationText(d time.Duration) string {
	switch {
	case d <= 0:
		return "0"
	case d < time.Millisecond:
		return fmt.Sprintf("%d µs", d.Microseconds())
	case d < time.Second:
		return fmt.Sprintf("%.3g ms", float64(d)/float64(time.Millisecond))
	case d < time.Minute:
		return fmt.Sprintf("%.3g s", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
}

// agoText is how long before now t was; "never" for the zero time.
func agoText(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	if time.Since(t) < time.Second {
		return "just now"
	}
	return durationText(time.Since(t).Round(time.Second)) + " ago"
}

// utcText is a time as the pages show it (UTC, to the minute).
func utcText(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04 UTC")
}

// kindText shows a kind not yet known as an ellipsis.
func kindText(kind string) string {
	if kind == "" {
		return "…"
	}
	return kind
}

func userText(user string) string {
	if user == "" {
		return "(anonymous)"
	}
	return user
}

func percentText(part, whole int64) string {
	if whole <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*float64(part)/float64(whole))
}
