package chart

import (
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestTimeTicks: over spans from a minute to months, ticks fall on round
// UTC times (whole seconds, minutes or hours that divide a day, midnights,
// Mondays, firsts of months), evenly spaced, inside the span, no more than
// asked and at least two; their labels differ and say what a reader
// expects. The old axis ticked a day at 10:00:00, 15:33:20, 21:06:40
// (steps of 20,000 s).
func TestTimeTicks(t *testing.T) {
	start := time.Date(2026, 11, 21, 9, 37, 13, 0, time.UTC) // a Saturday, off every round time
	for _, c := range []struct {
		span  time.Duration
		step  time.Duration // 0: months
		round func(time.Time) bool
		label string // of the first tick
	}{
		{time.Minute, 10 * time.Second, func(t time.Time) bool { return t.Second()%10 == 0 }, "09:37:20"},
		{5 * time.Minute, time.Minute, func(t time.Time) bool { return t.Second() == 0 }, "09:38"},
		{time.Hour, 10 * time.Minute, func(t time.Time) bool { return t.Second() == 0 && t.Minute()%10 == 0 }, "09:40"},
		{6 * time.Hour, time.Hour, func(t time.Time) bool { return t.Second() == 0 && t.Minute() == 0 }, "10:00"},
		{24 * time.Hour, 6 * time.Hour, func(t time.Time) bool { return t.Minute() == 0 && t.Hour()%6 == 0 }, "12:00"},
		{7 * 24 * time.Hour, 2 * 24 * time.Hour, func(t time.Time) bool { return t.Hour() == 0 && t.Minute() == 0 }, "Nov 23"},
		{30 * 24 * time.Hour, 7 * 24 * time.Hour, func(t time.Time) bool { return t.Weekday() == time.Monday && t.Hour() == 0 }, "Nov 23"},
		{120 * 24 * time.Hour, 0, func(t time.Time) bool { return t.Day() == 1 && t.Hour() == 0 }, "Dec"},
		{400 * 24 * time.Hour, 0, func(t time.Time) bool { return t.Day() == 1 && t.Hour() == 0 && (t.Month()-1)%2 == 0 }, "Jan 2027"},
	} {
		t.Run(c.span.String(), func(t *testing.T) {
			lo, hi := float64(start.Unix()), float64(start.Add(c.span).Unix())
			ticks, label := timeTicks(lo, hi, 6)
			if len(ticks) < 2 || len(ticks) > 7 {
				t.Fatalf("%d ticks: %v", len(ticks), ticks)
			}
			seen := map[string]bool{}
			for i, v := range ticks {
				tm := time.Unix(int64(v), 0).UTC()
				if v < lo || v > hi || !c.round(tm) {
					t.Fatalf("tick %d at %s: outside the span or not round", i, tm)
				}
				if i > 0 && c.step > 0 && tm.Sub(time.Unix(int64(ticks[i-1]), 0)) != c.step {
					t.Fatalf("ticks %s apart, want %s", tm.Sub(time.Unix(int64(ticks[i-1]), 0)), c.step)
				}
				l := label(v)
				if seen[l] || scientific.MatchString(l) {
					t.Fatalf("label %q repeated or not a time", l)
				}
				seen[l] = true
			}
			if got := label(ticks[0]); got != c.label {
				t.Fatalf("first label %q, want %q", got, c.label)
			}
		})
	}
	// Midnight on an axis of hours names the day.
	ticks, label := timeTicks(float64(start.Unix()), float64(start.Add(30*time.Hour).Unix()), 6)
	var labels []string
	for _, v := range ticks {
		labels = append(labels, label(v))
	}
	if got := strings.Join(labels, " "); got != "12:00 18:00 Nov 22 06:00 12:00" {
		t.Fatalf("labels over 30 h: %s", got)
	}
}

// TestValueText: values print in the unit that suits them, with about
// three significant digits, never in scientific notation; ticks with the
// decimals their step needs.
func TestValueText(t *testing.T) {
	for _, c := range []struct {
		v    float64
		s    Scale
		most float64
		want string
	}{
		{5e-05, CPUPerSecond, 5e-05, "50 µs/s"},
		{0.0123, CPUPerSecond, 0.05, "12.3 ms/s"},
		{2.5, CPUPerSecond, 2.5, "2.5 cores"},
		{0, CPUPerSecond, 0, "0 µs/s"},
		{1536, Bytes, 1536, "1.5 KiB"},
		{3 << 30, Bytes, 3 << 30, "3 GiB"},
		{100, Bytes, 100, "100 B"},
		{0.25, Seconds, 0.25, "250 ms"},
		{0.01, RequestsPerMinute, 0.01, "0.6 req/h"},
		{90, RequestsPerMinute, 90, "1.5 req/s"},
		{5400, Seconds, 5400, "1.5 h"},
		{0.00005, nil, 0, "0.00005"},
		{0.000123456, nil, 0, "0.000123"},
		{-0.0000001, nil, 0, "0"},
		{123456789, nil, 0, "123456789"},
	} {
		got := unitFor(Options{Scale: c.s}, c.most).text(c.v)
		if got != c.want {
			t.Errorf("%g in %v (most %g): %q, want %q", c.v, c.s, c.most, got, c.want)
		}
	}
	if got := CPUPerSecond.Text(5e-05); got != "50 µs/s" {
		t.Errorf("CPUPerSecond.Text(5e-05) = %q", got)
	}
	for _, c := range []struct {
		v, step float64
		want    string
	}{
		{0.0005, 0.0005, "0.0005"}, {0.00075, 0.00025, "0.00075"}, {2.5, 2.5, "2.5"}, {20000, 5000, "20000"},
		{-0.00000000001, 0.1, "0"}, {1e-5, 1e-5, "0.00001"},
	} {
		if got := tickText(c.v, c.step); got != c.want {
			t.Errorf("tick %g step %g: %q, want %q", c.v, c.step, got, c.want)
		}
	}
}

// TestCostsChartsRead: a day of tiny CPU (the dashboard's 5e-05 cores)
// draws with ticks in µs/s and a time axis on round hours; bytes tick on
// round binary sizes.
func TestCostsChartsRead(t *testing.T) {
	start := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	var cpu, bytes Series
	for i := range 24 {
		x := float64(start.Add(time.Duration(i) * time.Hour).Unix())
		cpu.Points = append(cpu.Points, Point{X: x, Y: 5e-05 * float64(i%3)})
		bytes.Points = append(bytes.Points, Point{X: x, Y: float64(i) * float64(300<<20)})
	}
	svg := draw(t, func(w io.Writer) error {
		return Lines(w, Options{Title: "git CPU", Scale: CPUPerSecond}, true, []Series{cpu})
	})
	wellFormed(t, svg)
	texts := textsOf(svg)
	if scientific.MatchString(texts) || !strings.Contains(texts, "100 µs/s") {
		t.Fatalf("CPU ticks not in µs/s: %s", texts)
	}
	for _, want := range []string{"12:00", "18:00", "Nov 22", "06:00"} {
		if !strings.Contains(texts, want) {
			t.Fatalf("time axis lacks %q: %s", want, texts)
		}
	}
	if strings.Contains(texts, "15:33:20") || strings.Contains(texts, ":20") {
		t.Fatalf("time axis not on round hours: %s", texts)
	}
	svg = draw(t, func(w io.Writer) error {
		return Lines(w, Options{Scale: Bytes}, true, []Series{bytes})
	})
	if texts := textsOf(svg); !strings.Contains(texts, "2 GiB") || !strings.Contains(texts, "8 GiB") {
		t.Fatalf("byte ticks not on round GiB: %s", texts)
	}
}

var scientific = regexp.MustCompile(`\d[eE][-+]?\d`)

var textRE = regexp.MustCompile(`<text[^>]*>([^<]*)</text>`)

// textsOf is every <text> of an SVG, "|"-separated.
func textsOf(svg string) string {
	var b strings.Builder
	for _, m := range textRE.FindAllStringSubmatch(svg, -1) {
		fmt.Fprintf(&b, "%s|", m[1])
	}
	return b.String()
}
