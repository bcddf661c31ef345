package dashboard

import (
	"bytes"
	"fmt"
	"html/template"
	"net/http"
	"time"

	"packwire/internal/chart"
	"packwire/internal/governor"
)

// windows are the preset windows of the Costs page.
var windows = []struct{ Name, Label string }{{"1h", "last hour"}, {"24h", "last 24 hours"}, {"7d", "last 7 days"}, {"custom", "custom"}}

var windowDurations = map[string]time.Duration{"1h": time.Hour, "24h": 24 * time.Hour, "7d": 7 * 24 * time.Hour}

// customLayout is what a datetime-local input sends; the page says UTC.
const customLayout = "2006-01-02T15:04"

type costsView struct {
	Window   string
	Windows  []struct{ Name, Label string }
	From, To string // custom inputs, as sent back
	Error    string
	Costs    *governor.Costs
	Tables   []costTable
	Walls    []governor.WallPercentiles
	Requests template.HTML // time series charts
	CPU      template.HTML
	Step     string
	Cores    string // mean CPU time a second over the window ("171 µs/s", "1.2 cores")
}

type costTable struct {
	Dim   string
	Chart template.HTML
	Rows  []governor.CostGroup
	More  int // groups past the top
}

// parseWindow reads ?window= (and ?from=&to= for custom) into a time range.
func parseWindow(r *http.Request, now time.Time) (name string, from, to time.Time, err error) {
	q := r.URL.Query()
	name = q.Get("window")
	if name == "" {
		name = "24h"
	}
	if d, ok := windowDurations[name]; ok {
		return name, now.Add(-d), now, nil
	}
	if name != "custom" {
		return "24h", now.Add(-24 * time.Hour), now, fmt.Errorf("unknown window %q: choose 1h, 24h, 7d or custom", name)
	}
	parse := func(field string) (time.Time, error) {
		s := q.Get(field)
		for _, layout := range []string{customLayout, time.RFC3339} {
			if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
				return t, nil
			}
		}
		return time.Time{}, fmt.Errorf("%s: want a time like 2026-11-21T09:30 (UTC), got %q", field, s)
	}
	if from, err = parse("from"); err != nil {
		return name, from, to, err
	}
	if to, err = parse("to"); err != nil {
		return name, from, to, err
	}
	if !to.After(from) {
		return name, from, to, fmt.Errorf("the window must end after it starts")
	}
	if to.Sub(from) > 400*24*time.Hour {
		return name, from, to, fmt.Errorf("the window may span at most 400 days")
	}
	return name, from, to, nil
}

func (h *Handler) costs(w http.ResponseWriter, r *http.Request, who string) {
	now := time.Now()
	name, from, to, err := parseWindow(r, now)
	v := costsView{Window: name, Windows: windows, From: r.URL.Query().Get("from"), To: r.URL.Query().Get("to")}
	if name != "custom" {
		v.From, v.To = from.UTC().Format(customLayout), to.UTC().Format(customLayout)
	}
	p := page{Title: "Costs", Nav: "costs", User: who, Data: &v}
	if err != nil {
		v.Error = err.Error()
		p.Status = http.StatusBadRequest
		h.render(w, "costs", p)
		return
	}
	if h.Governor == nil {
		v.Error = "request accounting is off"
		h.render(w, "costs", p)
		return
	}
	c, err := h.Governor.Costs(r.Context(), from, to, 15, 120)
	if err != nil {
		h.fail(w, who, http.StatusInternalServerError, "reading the request records failed", err)
		return
	}
	v.Costs = c
	v.Walls = c.Walls
	v.Step = stepText(c.Step)
	if span := c.To.Sub(c.From); span > 0 {
		v.Cores = chart.CPUPerSecond.Text(c.Total.CPU.Seconds() / span.Seconds())
	}
	var reqs, cpu chart.Series
	reqs.Name, cpu.Name = "requests", "git CPU"
	// Rates people read whatever the step: requests a minute (shown an
	// hour or a second when that reads better), and CPU seconds a second
	// of wall clock (shown as µs/s, ms/s or cores).
	for _, pt := range c.Series {
		x := float64(pt.Start.Unix())
		reqs.Points = append(reqs.Points, chart.Point{X: x, Y: float64(pt.Requests) / c.Step.Minutes()})
		cpu.Points = append(cpu.Points, chart.Point{X: x, Y: pt.CPU.Seconds() / c.Step.Seconds()})
	}
	v.Requests = svg(func(b *bytes.Buffer) error {
		return chart.Lines(b, chart.Options{Title: "Requests (mean rate per " + v.Step + ")", Scale: chart.RequestsPerMinute, Width: 720, Height: 220}, true, []chart.Series{reqs})
	})
	v.CPU = svg(func(b *bytes.Buffer) error {
		return chart.Lines(b, chart.Options{Title: "git CPU time a second (mean per " + v.Step + ")", Scale: chart.CPUPerSecond, Width: 720, Height: 220}, true, []chart.Series{cpu})
	})
	for _, dim := range governor.CostDims {
		b := c.By[dim]
		if dim == "node" && !recordsCarryNodes(b) {
			continue // a single server: one row, no name
		}
		t := costTable{Dim: dim, Rows: b.Groups, More: b.All - len(b.Groups)}
		var most time.Duration
		for _, g := range b.Groups {
			most = max(most, g.CPU)
		}
		unit, scale := cpuUnit(most)
		var bars []chart.Bar
		for _, g := range b.Groups {
			label := g.Key
			if dim == "user" {
				label = userText(label)
			}
			bars = append(bars, chart.Bar{Label: label, Value: float64(g.CPU) / float64(scale), Note: fmt.Sprintf("(%d req)", g.Requests)})
		}
		t.Chart = svg(func(buf *bytes.Buffer) error {
			return chart.Bars(buf, chart.Options{Title: "git CPU by " + dim, Unit: unit, Width: 520}, bars)
		})
		v.Tables = append(v.Tables, t)
	}
	h.render(w, "costs", p)
}

// recordsCarryNodes tells whether a node breakdown comes from a cluster's
// nodes rather than one server's unnamed records.
func recordsCarryNodes(b governor.Breakdown) bool {
	for _, g := range b.Groups {
		if g.Key != "" {
			return true
		}
	}
	return false
}

// stepText names a series step: "minute", "15 minutes", "hour", "6 hours".
func stepText(d time.Duration) string {
	switch {
	case d == time.Minute:
		return "minute"
	case d < time.Hour:
		return fmt.Sprintf("%d minutes", int(d.Minutes()))
	case d == time.Hour:
		return "hour"
	case d < 24*time.Hour:
		return fmt.Sprintf("%d hours", int(d.Hours()))
	case d == 24*time.Hour:
		return "day"
	}
	return fmt.Sprintf("%d days", int(d.Hours()/24))
}

// cpuUnit picks the unit a chart of CPU times up to most reads best in.
func cpuUnit(most time.Duration) (string, time.Duration) {
	switch {
	case most >= 2*time.Hour:
		return "h", time.Hour
	case most >= 2*time.Minute:
		return "min", time.Minute
	case most >= 2*time.Second:
		return "s", time.Second
	}
	return "ms", time.Millisecond
}

// svg renders a chart for a page. The chart package escapes its text and
// writes no scripts, so its output is trusted HTML.
func svg(draw func(*bytes.Buffer) error) template.HTML {
	var b bytes.Buffer
	if err := draw(&b); err != nil && b.Len() == 0 {
		return template.HTML(template.HTMLEscapeString("chart failed: " + err.Error()))
	}
	return template.HTML(b.String())
}
