// Package report turns a bench.Result into what people read: the study's
// two tables (clones; fetches with their reset), raw samples as JSON and
// CSV, and a self-contained HTML report with SVG charts that opens offline.
package report

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"packwire/internal/lab/bench"
	"packwire/internal/lab/compare"
	"packwire/internal/units"
)

// Stats summarise the samples of one measure, in its unit.
type Stats struct {
	N                 int
	Median, Mean, P95 float64
}

func statsOf(v []float64) Stats {
	if len(v) == 0 {
		return Stats{}
	}
	var sum float64
	for _, x := range v {
		sum += x
	}
	// p95 by nearest rank, as bench/ does.
	return Stats{N: len(v), Median: compare.Median(v), Mean: sum / float64(len(v)), P95: compare.Percentile(v, 95)}
}

// Scenario is one scenario's summary: statistics over its successful
// operations and the phase's server cost.
type Scenario struct {
	ID, Name, Command string
	Fetch             bool
	Ops, Errors       int
	Canceled          int
	Seconds           float64 // phase duration
	Wall, Reset       Stats   // ms
	Bytes, ResetBytes Stats   // bytes
	ClientCPU         Stats   // ms
	WithData          int     // successful operations that received pack data
	ServerPerOp       *float64
	ServerAttributed  Stats // ms per operation, when operations could be told apart (one user)
	ServerSource      string
	ServerNote        string
	ServerRecords     int
	Pushes, PushFails int
	Check             *bench.Check
	Interrupted       bool
	Note              string
	ErrorCounts       []Count
}

// Count is an error message and how often it came.
type Count struct {
	Message string
	N       int
}

// Summarize computes every scenario's summary, in the run's order.
func Summarize(res *bench.Result) []Scenario {
	var out []Scenario
	for _, ph := range res.Phases {
		sc := Scenario{ID: ph.Scenario, Name: ph.Name, Command: ph.Command, Ops: ph.Ops, Errors: ph.Errors, Canceled: ph.Canceled,
			ServerPerOp: ph.ServerCPUPerOpMS, ServerSource: ph.ServerSource, ServerNote: ph.ServerNote, ServerRecords: ph.ServerRecords,
			Pushes: ph.Pushes, PushFails: ph.PushFailures, Check: ph.Check, Interrupted: ph.Interrupted, Note: ph.Note}
		if s, ok := bench.Lookup(ph.Scenario); ok {
			sc.Fetch = s.Fetch
		}
		if !ph.End.IsZero() {
			sc.Seconds = ph.End.Sub(ph.Start).Seconds()
		}
		var wall, reset, bytes, resetBytes, cpu, server []float64
		errs := map[string]int{}
		for _, s := range res.Samples {
			if s.Scenario != ph.Scenario {
				continue
			}
			if s.Result == bench.ResultError {
				errs[s.Error]++
			}
			if s.Result != bench.ResultOK {
				continue
			}
			wall = append(wall, s.WallMS)
			if s.Bytes > 0 {
				sc.WithData++
			}
			bytes = append(bytes, float64(s.Bytes))
			cpu = append(cpu, s.ClientCPUMS)
			if s.ResetMS != nil {
				reset = append(reset, *s.ResetMS)
			}
			if s.ResetBytes != nil {
				resetBytes = append(resetBytes, float64(*s.ResetBytes))
			}
			if s.ServerCPUMS != nil {
				server = append(server, *s.ServerCPUMS)
			}
		}
		sc.Wall, sc.Reset, sc.Bytes, sc.ResetBytes, sc.ClientCPU = statsOf(wall), statsOf(reset), statsOf(bytes), statsOf(resetBytes), statsOf(cpu)
		sc.ServerAttributed = statsOf(server)
		for msg, n := range errs {
			sc.ErrorCounts = append(sc.ErrorCounts, Count{msg, n})
		}
		sort.Slice(sc.ErrorCounts, func(i, j int) bool {
			a, b := sc.ErrorCounts[i], sc.ErrorCounts[j]
			return a.N > b.N || a.N == b.N && a.Message < b.Message
		})
		out = append(out, sc)
	}
	return out
}

// table is a table for both renderings: text and HTML.
type table struct {
	Title  string
	Header []string
	Rows   [][]string
	Notes  []string
}

func msText(v float64) string {
	switch {
	case v >= 100_000:
		return fmt.Sprintf("%.0f s", v/1000)
	case v >= 10_000:
		return fmt.Sprintf("%.1f s", v/1000)
	case v >= 1000:
		return fmt.Sprintf("%s ms", thousands(int64(math.Round(v))))
	case v >= 10:
		return fmt.Sprintf("%.0f ms", v)
	}
	return fmt.Sprintf("%.1f ms", v)
}

func thousands(n int64) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + thousands(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// bytesText is a byte count (a mean or median, so fractional) as every
// packwire command shows sizes.
func bytesText(v float64) string { return units.Bytes(int64(math.Round(v))) }

func ratio(v, base float64) string {
	if base <= 0 || math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.2fx", v/base)
}

func meanP95(s Stats) string {
	if s.N == 0 {
		return "-"
	}
	return fmt.Sprintf("%s (%s)", msText(s.Mean), msText(s.P95))
}

func median(s Stats) string {
	if s.N == 0 {
		return "-"
	}
	return msText(s.Median)
}

const notMeasured = "not measured"

func serverText(sc Scenario) string {
	if sc.ServerPerOp == nil {
		return notMeasured
	}
	return msText(*sc.ServerPerOp)
}

// tables builds the study's two tables from the summaries. The study put
// one repository per row and the scenarios in columns; a run measures one
// repository, so its rows are the measures and the columns the scenarios,
// and the last row repeats the results in the study's own form.
func tables(sums []Scenario) []table {
	var clones, fetches []Scenario
	for _, s := range sums {
		if s.Fetch {
			fetches = append(fetches, s)
		} else {
			clones = append(clones, s)
		}
	}
	var out []table
	if len(clones) > 0 {
		out = append(out, cloneTable(clones))
	}
	if len(fetches) > 0 {
		out = append(out, fetchTable(fetches))
	}
	return out
}

// base returns the scenario the ratios are relative to (T1 or T5), if run.
func base(list []Scenario, id string) *Scenario {
	for i := range list {
		if list[i].ID == id && list[i].Wall.N > 0 {
			return &list[i]
		}
	}
	return nil
}

func header(list []Scenario) []string {
	h := []string{""}
	for _, s := range list {
		h = append(h, s.ID+" "+shortName(s.ID))
	}
	return h
}

func shortName(id string) string {
	if s, ok := bench.Lookup(id); ok {
		return s.Short
	}
	return id
}

func row(label string, list []Scenario, cell func(Scenario) string) []string {
	r := []string{label}
	for _, s := range list {
		r = append(r, cell(s))
	}
	return r
}

func ratioPair(v, b Stats) string {
	if v.N == 0 {
		return "-"
	}
	return ratio(v.Median, b.Median) + " / " + ratio(v.Mean, b.Mean)
}

func serverRatio(s Scenario, b *Scenario) string {
	if b == nil || s.ServerPerOp == nil || b.ServerPerOp == nil {
		return "-"
	}
	return ratio(*s.ServerPerOp, *b.ServerPerOp)
}

func countsText(s Scenario) string {
	t := fmt.Sprintf("%d", s.Ops)
	if s.Errors > 0 {
		t += fmt.Sprintf(" (%d errors)", s.Errors)
	}
	if s.Seconds > 0 {
		t += fmt.Sprintf(", %.1f/s", float64(s.Ops)/s.Seconds)
	}
	return t
}

func cloneTable(list []Scenario) table {
	b := base(list, "T1")
	t := table{Title: "Clones: client time and server git CPU per clone", Header: header(list)}
	t.Rows = append(t.Rows,
		row("operations", list, countsText),
		row("time median", list, func(s Scenario) string { return median(s.Wall) }),
		row("time mean (p95)", list, func(s Scenario) string { return meanP95(s.Wall) }),
	)
	if b != nil {
		t.Rows = append(t.Rows, row("  ratio to T1 (median / mean)", list, func(s Scenario) string { return ratioPair(s.Wall, b.Wall) }))
	}
	t.Rows = append(t.Rows, row("git CPU per clone (server)", list, serverText))
	if b != nil {
		t.Rows = append(t.Rows, row("  ratio to T1", list, func(s Scenario) string { return serverRatio(s, b) }))
	}
	t.Rows = append(t.Rows, serverAttributedRows(list)...)
	t.Rows = append(t.Rows,
		row("client git CPU mean", list, func(s Scenario) string { return statMean(s.ClientCPU) }),
		row("pack bytes median", list, func(s Scenario) string { return bytesMedian(s.Bytes) }),
		row("study's form: mean time / git CPU", list, func(s Scenario) string {
			if s.Wall.N == 0 {
				return "-"
			}
			return msText(s.Wall.Mean) + " / " + serverText(s)
		}),
	)
	if b == nil {
		t.Notes = append(t.Notes, "T1 was not run (or had no successful clone): no ratios.")
	}
	return t
}

func fetchTable(list []Scenario) table {
	b := base(list, "T5")
	t := table{Title: "Fetches: fetch time, reset time and server git CPU per fetch", Header: header(list)}
	t.Rows = append(t.Rows,
		row("operations", list, countsText),
		row("fetch median", list, func(s Scenario) string { return median(s.Wall) }),
		row("fetch mean (p95)", list, func(s Scenario) string { return meanP95(s.Wall) }),
	)
	if b != nil {
		t.Rows = append(t.Rows, row("  ratio to T5 (median / mean)", list, func(s Scenario) string { return ratioPair(s.Wall, b.Wall) }))
	}
	t.Rows = append(t.Rows,
		row("reset median", list, func(s Scenario) string { return median(s.Reset) }),
		row("reset mean (p95)", list, func(s Scenario) string { return meanP95(s.Reset) }),
	)
	if b != nil {
		t.Rows = append(t.Rows, row("  ratio to T5 (median / mean)", list, func(s Scenario) string { return ratioPair(s.Reset, b.Reset) }))
	}
	t.Rows = append(t.Rows, row("git CPU per fetch (server)", list, serverText))
	if b != nil {
		t.Rows = append(t.Rows, row("  ratio to T5", list, func(s Scenario) string { return serverRatio(s, b) }))
	}
	t.Rows = append(t.Rows, serverAttributedRows(list)...)
	t.Rows = append(t.Rows,
		row("client git CPU mean", list, func(s Scenario) string { return statMean(s.ClientCPU) }),
		row("pack bytes mean: fetch / reset", list, func(s Scenario) string {
			if s.Bytes.N == 0 {
				return "-"
			}
			return bytesText(s.Bytes.Mean) + " / " + bytesText(s.ResetBytes.Mean)
		}),
		row("fetches that received data", list, func(s Scenario) string {
			if s.Ops == 0 {
				return "-"
			}
			return fmt.Sprintf("%d (%.0f%%)", s.WithData, 100*float64(s.WithData)/float64(s.Ops))
		}),
		row("pushes during the phase", list, func(s Scenario) string {
			if s.PushFails > 0 {
				return fmt.Sprintf("%d (%d failed)", s.Pushes, s.PushFails)
			}
			return fmt.Sprint(s.Pushes)
		}),
		row("study's form: mean fetch / reset / git CPU", list, func(s Scenario) string {
			if s.Wall.N == 0 {
				return "-"
			}
			cpu := serverText(s)
			return strings.TrimSuffix(msText(s.Wall.Mean), " ms") + " / " + strings.TrimSuffix(msText(s.Reset.Mean), " ms") + " / " + cpu
		}),
	)
	if b == nil {
		t.Notes = append(t.Notes, "T5 was not run (or had no successful fetch): no ratios.")
	}
	return t
}

// serverAttributedRows are the per-operation server CPU statistics, shown
// when requests could be attributed to single operations (one user).
func serverAttributedRows(list []Scenario) [][]string {
	for _, s := range list {
		if s.ServerAttributed.N > 0 {
			return [][]string{
				row("  per operation median (p95)", list, func(s Scenario) string {
					if s.ServerAttributed.N == 0 {
						return "-"
					}
					return msText(s.ServerAttributed.Median) + " (" + msText(s.ServerAttributed.P95) + ")"
				}),
			}
		}
	}
	return nil
}

func statMean(s Stats) string {
	if s.N == 0 {
		return "-"
	}
	return msText(s.Mean)
}

func bytesMedian(s Stats) string {
	if s.N == 0 {
		return "-"
	}
	return bytesText(s.Median)
}

// findings are the lines under the tables: shape checks that failed, the
// pusher's verification, errors by message.
func findings(res *bench.Result, sums []Scenario) []string {
	var out []string
	if res.Meta.Interrupted {
		out = append(out, "Interrupted: the run was stopped early; the figures cover what was measured until then.")
	}
	for _, s := range sums {
		if s.Check != nil && !s.Check.OK {
			desc := fmt.Sprintf("shallow=%v filter=%q promisor=%v missing objects=%d", s.Check.Shallow, s.Check.Filter, s.Check.Promisor, s.Check.MissingObjects)
			if s.Check.Error != "" {
				desc = s.Check.Error
			}
			out = append(out, fmt.Sprintf("%s: the repository is not %s as the scenario asks (%s): the server may ignore the option", s.ID, s.Check.Want, desc))
		}
		if s.Note != "" {
			out = append(out, s.ID+": "+s.Note)
		}
		if s.ServerPerOp == nil && s.ServerNote != "" && !strings.HasPrefix(s.ServerNote, "not measured (no ") {
			out = append(out, s.ID+": server CPU "+s.ServerNote)
		}
		for i, c := range s.ErrorCounts {
			if i == 5 {
				out = append(out, fmt.Sprintf("%s: ... %d more distinct errors", s.ID, len(s.ErrorCounts)-5))
				break
			}
			out = append(out, fmt.Sprintf("%s: %d x error: %s", s.ID, c.N, c.Message))
		}
	}
	p := res.Pusher
	switch {
	case p.Pushes == 0 && p.Failures == 0:
	case !p.Verified:
		out = append(out, fmt.Sprintf("Pusher: %d pushes, %d failed; %s", p.Pushes, p.Failures, p.Note))
	case len(p.Lost) > 0:
		out = append(out, fmt.Sprintf("Pusher: %d pushes, %d failed; LOST %d pushed commits that the server's %s does not contain: %s", p.Pushes, p.Failures, len(p.Lost), res.Meta.Branch, strings.Join(p.Lost, " ")))
	default:
		out = append(out, fmt.Sprintf("Pusher: %d pushes, %d failed; every pushed commit is in the server's %s (verified at %.12s).", p.Pushes, p.Failures, res.Meta.Branch, p.Tip))
	}
	return out
}

func duration(a, b time.Time) string {
	return b.Sub(a).Round(100 * time.Millisecond).String()
}
