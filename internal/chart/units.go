package chart

import (
	"math"
	"strconv"
	"strings"
	"time"
)

// Unit is one unit of a Scale: Size is how many of the data's base unit
// it holds (a KiB holds 1024 bytes).
type Unit struct {
	Name string
	Size float64
}

// Scale is the units a chart's values may be shown in, smallest first; the
// chart shows them in the largest unit its biggest value fills at least
// once, so that a CPU chart reads "0.05 ms/s", never "5e-05".
type Scale []Unit

// Scales for the data people read on the dashboard.
var (
	// Bytes, with binary prefixes.
	Bytes = Scale{{"B", 1}, {"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}}
	// CPUPerSecond is CPU time per second of wall clock, in seconds: "ms/s"
	// is milliseconds of CPU a second; a value of 1 and more is cores busy.
	CPUPerSecond = Scale{{"µs/s", 1e-6}, {"ms/s", 1e-3}, {"cores", 1}}
	// RequestsPerMinute is a rate of requests a minute, shown an hour when
	// it is below one a minute and a second from one a second.
	RequestsPerMinute = Scale{{"req/h", 1.0 / 60}, {"req/min", 1}, {"req/s", 60}}
	// Seconds is a duration in seconds.
	Seconds = Scale{{"µs", 1e-6}, {"ms", 1e-3}, {"s", 1}, {"min", 60}, {"h", 3600}}
)

// pick is the unit for values up to most (in absolute value).
func (s Scale) pick(most float64) Unit {
	if len(s) == 0 {
		return Unit{Size: 1}
	}
	u := s[0]
	for _, c := range s[1:] {
		if math.Abs(most) >= c.Size {
			u = c
		}
	}
	return u
}

// Text prints v (in the scale's base unit) in the unit that suits it:
// CPUPerSecond.Text(5e-05) is "50 µs/s".
func (s Scale) Text(v float64) string { return s.pick(v).text(v) }

// unitFor is the unit a chart with o shows values up to most in: its
// Scale's, else Options.Unit as it is.
func unitFor(o Options, most float64) Unit {
	if o.Scale != nil {
		return o.Scale.pick(most)
	}
	return Unit{Name: o.Unit, Size: 1}
}

// text prints v (in base units) in u.
func (u Unit) text(v float64) string {
	s := trimFloat(v / u.Size)
	if u.Name != "" {
		s += " " + u.Name
	}
	return s
}

// tickText prints a tick value with the decimals its step needs, so that
// neighbouring ticks never read the same (trailing zeros cut: 0, 0.5, 1),
// and never in scientific notation.
func tickText(v, step float64) string {
	decimals := 0
	for decimals < 9 {
		scaled := step * math.Pow(10, float64(decimals))
		if math.Abs(scaled-math.Round(scaled)) <= 1e-6*scaled {
			break
		}
		decimals++
	}
	if math.Abs(v) < step*1e-6 {
		v = 0 // -0 and rounding dust
	}
	s := strconv.FormatFloat(v, 'f', decimals, 64)
	if decimals > 0 {
		s = strings.TrimSuffix(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// timeStep is one spacing of time ticks: a fixed length, or months.
type timeStep struct {
	d      time.Duration
	months int
	layout string // time.Format layout of its labels
}

// timeSteps are the round spacings of a time axis, smallest first.
var timeSteps = func() []timeStep {
	var steps []timeStep
	for _, s := range []int{1, 2, 5, 10, 15, 30} {
		steps = append(steps, timeStep{d: time.Duration(s) * time.Second, layout: "15:04:05"})
	}
	for _, m := range []int{1, 2, 5, 10, 15, 30} {
		steps = append(steps, timeStep{d: time.Duration(m) * time.Minute, layout: "15:04"})
	}
	for _, h := range []int{1, 2, 3, 6, 12} {
		steps = append(steps, timeStep{d: time.Duration(h) * time.Hour, layout: "15:04"})
	}
	for _, d := range []int{1, 2, 7, 14} {
		steps = append(steps, timeStep{d: time.Duration(d) * 24 * time.Hour, layout: "Jan 2"})
	}
	for _, m := range []int{1, 2, 3, 6, 12} {
		steps = append(steps, timeStep{months: m, layout: "Jan 2006"})
	}
	return steps
}()

// timeTicks returns ticks at round UTC times within [lo, hi] (unix
// seconds), about n of them at most (n+1 when the span is a whole number
// of steps): on whole seconds, minutes or hours
// that divide a day, midnights, Mondays for weeks, the first of months.
// label names each tick, with the date at midnight on an axis of hours.
func timeTicks(lo, hi float64, n int) (ticks []float64, label func(float64) string) {
	from := time.Unix(int64(math.Ceil(lo)), 0).UTC()
	to := time.Unix(int64(math.Floor(hi)), 0).UTC()
	span := to.Sub(from)
	step := timeSteps[len(timeSteps)-1]
	for _, s := range timeSteps {
		if span/s.length() <= time.Duration(max(n, 1)) {
			step = s
			break
		}
	}
	for t := step.first(from); !t.After(to) && len(ticks) < 100; t = step.next(t) {
		ticks = append(ticks, float64(t.Unix()))
	}
	label = func(v float64) string {
		t := time.Unix(int64(v), 0).UTC()
		if step.layout == "15:04" && t.Hour() == 0 && t.Minute() == 0 {
			return t.Format("Jan 2") // a new day on an axis of hours
		}
		if step.months > 0 && step.months < 12 && t.Month() != time.January {
			return t.Format("Jan")
		}
		return t.Format(step.layout)
	}
	return ticks, label
}

// length is the step's length, a month counted as 30 days.
func (s timeStep) length() time.Duration {
	if s.months > 0 {
		return time.Duration(s.months) * 30 * 24 * time.Hour
	}
	return s.d
}

// first is the first tick at or after t.
func (s timeStep) first(t time.Time) time.Time {
	if s.months > 0 {
		m := time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
		if m.Before(t) {
			m = m.AddDate(0, 1, 0)
		}
		for (int(m.Month())-1)%s.months != 0 {
			m = m.AddDate(0, 1, 0)
		}
		return m
	}
	origin := time.Unix(0, 0).UTC() // a midnight: steps up to a day divide days
	if s.d == 7*24*time.Hour || s.d == 14*24*time.Hour {
		origin = origin.AddDate(0, 0, 4) // Monday, January 5, 1970
	}
	k := t.Sub(origin) / s.d
	f := origin.Add(k * s.d)
	if f.Before(t) {
		f = f.Add(s.d)
	}
	return f
}

func (s timeStep) next(t time.Time) time.Time {
	if s.months > 0 {
		return t.AddDate(0, s.months, 0)
	}
	return t.Add(s.d)
}
