package report

import (
	"bytes"
	"errors"
	"fmt"
	"html/template"
	"io"
	"net/url"
	"strings"

	"packwire/internal/chart"
	"packwire/internal/lab/bench"
	"packwire/internal/units"
)

// WriteHTML writes the report: one page, inline CSS and SVG, no scripts
// and no remote assets, so it opens offline and can be mailed around.
func WriteHTML(w io.Writer, res *bench.Result) error {
	sums := Summarize(res)
	page := htmlPage{
		Title:    "packwire bench, " + res.Meta.Started.UTC().Format("2006-01-02 15:04 UTC"),
		Meta:     metaRows(res.Meta),
		Tables:   tables(sums),
		Findings: findings(res, sums),
		Checks:   checkRows(sums),
		Res:      res,
	}
	if u, err := url.Parse(res.Meta.URL); err == nil && u.Path != "" {
		page.Title = "packwire bench: " + strings.TrimPrefix(u.Path, "/") + ", " + res.Meta.Started.UTC().Format("2006-01-02 15:04 UTC")
	}
	var err error
	if page.Charts, err = charts(res, sums); err != nil {
		return err
	}
	return pageTemplate.Execute(w, page)
}

type htmlPage struct {
	Title    string
	Meta     [][2]string
	Tables   []table
	Findings []string
	Checks   [][]string
	Charts   []htmlChart
	Res      *bench.Result
}

type htmlChart struct {
	Title   string
	Caption string
	SVG     template.HTML
}

func metaRows(m bench.Meta) [][2]string {
	rows := [][2]string{}
	add := func(k, v string) {
		if v != "" {
			rows = append(rows, [2]string{k, v})
		}
	}
	add("target", m.Target)
	add("repository URL", m.URL)
	add("push URL", m.PushURL)
	add("branch", m.Branch)
	add("git client", m.GitVersion)
	add("protocol", fmt.Sprintf("v%d", m.Protocol))
	add("users", fmt.Sprint(m.Users))
	add("per scenario", perScenario(m))
	add("pusher interval", m.PusherInterval)
	add("scenarios", strings.Join(m.Scenarios, " "))
	add("server CPU", m.ServerCost)
	add("bytes", m.BytesMeasure)
	mc := m.Machine
	machine := fmt.Sprintf("%s/%s, %d CPUs", mc.OS, mc.Arch, mc.CPUs)
	if mc.CPUModel != "" {
		machine += ", " + mc.CPUModel
	}
	if mc.MemoryBytes > 0 {
		machine += ", " + units.Bytes(mc.MemoryBytes) + " memory"
	}
	if mc.Kernel != "" {
		machine += ", " + mc.Kernel
	}
	add("client machine", machine)
	add("host", mc.Hostname)
	add("started", m.Started.UTC().Format("2006-01-02 15:04:05 UTC"))
	if !m.Finished.IsZero() {
		add("finished", m.Finished.UTC().Format("2006-01-02 15:04:05 UTC")+" ("+duration(m.Started, m.Finished)+")")
	}
	if m.Interrupted {
		add("interrupted", "yes: stopped before the end; what was measured is below")
	}
	add("packwire", m.Version)
	for _, n := range m.Notes {
		add("note", n)
	}
	return rows
}

func checkRows(sums []Scenario) [][]string {
	var rows [][]string
	for _, s := range sums {
		if s.Check == nil {
			continue
		}
		c := s.Check
		verdict := "yes"
		if !c.OK {
			verdict = "NO"
		}
		filter := c.Filter
		if filter == "" {
			filter = "-"
		}
		rows = append(rows, []string{s.ID, c.Want, verdict, fmt.Sprint(c.Shallow), filter, fmt.Sprint(c.Promisor), fmt.Sprint(c.MissingObjects)})
	}
	return rows
}

// charts draws the report's SVGs: distributions of client times, server
// CPU per operation, and operations over time.
func charts(res *bench.Result, sums []Scenario) ([]htmlChart, error) {
	var out []htmlChart
	draw := func(title, caption string, f func(io.Writer) error) error {
		var b bytes.Buffer
		if err := f(&b); err != nil && !errors.Is(err, chart.ErrNoData) {
			return fmt.Errorf("chart %q: %w", title, err)
		}
		out = append(out, htmlChart{Title: title, Caption: caption, SVG: template.HTML(b.String())}) // chart escapes its text
		return nil
	}
	type pick func(bench.Sample) (float64, bool)
	groups := func(fetch bool, value pick) []chart.Group {
		var gs []chart.Group
		for _, sc := range sums {
			if sc.Fetch != fetch {
				continue
			}
			g := chart.Group{Label: sc.ID}
			for _, s := range res.Samples {
				if s.Scenario == sc.ID && s.Result == bench.ResultOK {
					if v, ok := value(s); ok {
						g.Values = append(g.Values, v)
					}
				}
			}
			gs = append(gs, g)
		}
		return gs
	}
	wall := func(s bench.Sample) (float64, bool) { return s.WallMS, true }
	reset := func(s bench.Sample) (float64, bool) {
		if s.ResetMS == nil {
			return 0, false
		}
		return *s.ResetMS, true
	}
	hasClones, hasFetches := false, false
	for _, sc := range sums {
		hasClones = hasClones || !sc.Fetch
		hasFetches = hasFetches || sc.Fetch
	}
	if hasClones {
		if err := draw("Clone time per operation", "Client wall time of each successful clone: box = quartiles, line = median, dots = operations.",
			func(w io.Writer) error {
				return chart.Distribution(w, chart.Options{Unit: "ms", YLabel: "clone time"}, groups(false, wall))
			}); err != nil {
			return nil, err
		}
	}
	if hasFetches {
		if err := draw("Fetch time per operation", "Client wall time of each successful git fetch.", func(w io.Writer) error {
			return chart.Distribution(w, chart.Options{Unit: "ms", YLabel: "fetch time"}, groups(true, wall))
		}); err != nil {
			return nil, err
		}
		if err := draw("Reset time after each fetch", "git reset --hard origin/<branch>: partial clones download the objects the new commits need here.", func(w io.Writer) error {
			return chart.Distribution(w, chart.Options{Unit: "ms", YLabel: "reset time"}, groups(true, reset))
		}); err != nil {
			return nil, err
		}
	}

	for _, fetch := range []bool{false, true} {
		if fetch && !hasFetches || !fetch && !hasClones {
			continue
		}
		var bars []chart.Bar
		for _, sc := range sums {
			if sc.Fetch == fetch && sc.ServerPerOp != nil {
				bars = append(bars, chart.Bar{Label: sc.ID + " " + shortName(sc.ID), Value: *sc.ServerPerOp, Note: fmt.Sprintf("(%d ops)", sc.Ops)})
			}
		}
		title, what := "Server CPU per clone", "clones"
		if fetch {
			title, what = "Server CPU per fetch", "fetches (and the lazy fetches of their resets)"
		}
		caption := "Server CPU of each phase divided by the " + what + " completed in it (" + res.Meta.ServerCost + ")."
		if len(bars) == 0 {
			caption = "Server CPU was not measured in this run (no governor, --server-cgroup or --server-pid)."
		}
		if err := draw(title, caption, func(w io.Writer) error {
			return chart.Bars(w, chart.Options{Unit: "ms"}, bars)
		}); err != nil {
			return nil, err
		}
	}
	attributed := false
	for _, sc := range sums {
		attributed = attributed || sc.ServerAttributed.N > 0
	}
	if attributed {
		server := func(s bench.Sample) (float64, bool) {
			if s.ServerCPUMS == nil {
				return 0, false
			}
			return *s.ServerCPUMS, true
		}
		gs := append(groups(false, server), groups(true, server)...)
		if err := draw("Server CPU of each operation", "With one user the governor's requests are attributed to the operation whose time window holds them.", func(w io.Writer) error {
			return chart.Distribution(w, chart.Options{Unit: "ms", YLabel: "server CPU"}, gs)
		}); err != nil {
			return nil, err
		}
	}

	overTime := func(fetch bool) []chart.Series {
		var series []chart.Series
		for _, sc := range sums {
			if sc.Fetch != fetch {
				continue
			}
			se := chart.Series{Name: sc.ID}
			for _, s := range res.Samples {
				if s.Scenario == sc.ID && s.Result == bench.ResultOK {
					se.Points = append(se.Points, chart.Point{X: float64(s.Start.UnixNano()) / 1e9, Y: s.WallMS})
				}
			}
			series = append(series, se)
		}
		if fetch && len(res.Pushes) > 0 {
			se := chart.Series{Name: "push"}
			for _, p := range res.Pushes {
				if p.Result == bench.ResultOK {
					se.Points = append(se.Points, chart.Point{X: float64(p.Start.UnixNano()) / 1e9, Y: p.WallMS})
				}
			}
			series = append(series, se)
		}
		return series // chart.Scatter sorts each series' points by X
	}
	if hasClones {
		if err := draw("Clones over time", "Each successful clone at its start time; a phase per scenario.", func(w io.Writer) error {
			return chart.Scatter(w, chart.Options{Unit: "ms", YLabel: "clone time"}, true, overTime(false))
		}); err != nil {
			return nil, err
		}
	}
	if hasFetches {
		if err := draw("Fetches and pushes over time", "Each successful fetch at its start time, and the pusher's pushes.", func(w io.Writer) error {
			return chart.Scatter(w, chart.Options{Unit: "ms", YLabel: "fetch time"}, true, overTime(true))
		}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

var pageTemplate = template.Must(template.New("report").Funcs(template.FuncMap{
	"sub": func(label string) bool { return strings.HasPrefix(label, " ") },
}).Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 75em; padding: 0 1em; color: #222; line-height: 1.4; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.92em; }
th, td { white-space: nowrap; padding: 0.25em 0.6em; border-bottom: 1px solid #eee; text-align: right; vertical-align: top; }
th { white-space: normal; }
th:first-child, td:first-child { text-align: left; }
table.meta td { text-align: left; white-space: normal; } table.meta td:first-child { color: #555; white-space: nowrap; }
tr.sub td:first-child { padding-left: 1.5em; color: #555; }
.notes, .caption { color: #555; font-size: 0.9em; }
.finding { background: #fff8e5; border-left: 3px solid #e69f00; padding: 0.3em 0.7em; margin: 0.3em 0; }
figure { margin: 1em 0 2em; } figcaption { color: #555; font-size: 0.9em; }
code { background: #f4f4f4; padding: 0 0.2em; }
</style>
</head>
<body>
<h1>{{.Title}}</h1>
<table class="meta">
{{range .Meta}}<tr><td>{{index . 0}}</td><td>{{index . 1}}</td></tr>
{{end}}</table>

{{range .Tables}}
<h2>{{.Title}}</h2>
<table>
<tr>{{range .Header}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr{{if sub (index . 0)}} class="sub"{{end}}>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table>
{{range .Notes}}<p class="notes">{{.}}</p>{{end}}
{{end}}

{{if .Findings}}<h2>Findings</h2>
{{range .Findings}}<div class="finding">{{.}}</div>
{{end}}{{end}}

{{if .Checks}}<h2>What each scenario's repository looked like</h2>
<p class="notes">Checked on the first operation of user 0: a shallow clone must be shallow, a partial clone must have its filter, a promisor remote and (with history) objects it does not have. A server that ignores <code>--filter</code> serves a full clone that git accepts with a warning only.</p>
<table>
<tr><th>scenario</th><th>wanted</th><th>as wanted</th><th>shallow</th><th>filter</th><th>promisor</th><th>missing objects</th></tr>
{{range .Checks}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table>{{end}}

<h2>Charts</h2>
{{range .Charts}}<figure>
<h3>{{.Title}}</h3>
{{.SVG}}
<figcaption>{{.Caption}}</figcaption>
</figure>
{{end}}

<h2>How to read this</h2>
<ul class="notes">
<li>Each scenario ran as its own phase, one after another; the server's CPU in a phase belongs to that scenario. The study (GitHub, "Git clone: a data-driven study on cloning behaviors", 2020) ran each test for 30 minutes; compare shapes and ratios, not absolute figures, across machines.</li>
<li><b>time</b>: client wall time of the git command. Fetches (T5-T10) go into clones prepared before the phase (not timed) and are followed by <code>git reset --hard origin/{{.Res.Meta.Branch}}</code>, timed separately: partial clones download the objects they need there.</li>
<li><b>git CPU</b>: server CPU per operation, the phase's total divided by the operations that completed ({{.Res.Meta.ServerCost}}). Failed operations count in the total but not in the divisor.</li>
<li><b>ratios</b> are to T1 (clones) and T5 (fetches): median / mean. The study's form repeats means as it printed them; its jquery row was 2,000 ms / 450 ms, 300 / 15, 900 / 270, 900 / 300 for T1-T4 and 200/5/4, 300/5/18, 200/5/4, 250/5/14, 200/85/9, 200/40/6 ms for T5-T10.</li>
<li><b>bytes</b>: {{.Res.Meta.BytesMeasure}}.</li>
<li>Raw samples: <a href="samples.json">samples.json</a>, <a href="samples.csv">samples.csv</a> (one row per operation).</li>
</ul>
</body>
</html>
`))
