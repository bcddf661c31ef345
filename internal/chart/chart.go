// Package chart draws small, self-contained SVG charts (bars, lines,
// scatter, distributions) for the lab's reports and the dashboard. Each
// function writes one inline <svg> element: no scripts, no external
// references and no CSS outside the element, so the output can be embedded
// in an HTML page that is opened offline or served under a strict CSP.
package chart

import (
	"errors"
	"fmt"
	"html"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
)

// Options are what every chart shares. Zero values work: 640 pixels wide,
// a height that suits the chart, no title and no unit.
type Options struct {
	Title         string
	Width, Height int
	Unit          string // appended to values and the value axis ("ms", "MiB")
	// Scale, when set, overrides Unit: values are in its base unit and are
	// shown in the unit that suits the largest (Bytes, CPUPerSecond).
	Scale          Scale
	XLabel, YLabel string
}

// Bar is one labelled value of a bar chart. Note is shown after the value.
type Bar struct {
	Label string
	Value float64
	Note  string
}

// Point is one (X, Y) sample; X is unix seconds on time axes.
type Point struct{ X, Y float64 }

// Series is a named sequence of points, drawn in one colour.
type Series struct {
	Name   string
	Points []Point
}

// Group is a named set of samples for Distribution.
type Group struct {
	Label  string
	Values []float64
}

// palette is colour-blind friendly (Okabe-Ito), in the order series get it.
var palette = []string{"#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000"}

const (
	fontSize   = 12
	charWidth  = 7 // approximate width of one character at fontSize, for layout
	titleSpace = 22
)

// ErrNoData is returned when there is nothing to draw; the chart still
// writes an SVG that says so, so a page never has a hole.
var ErrNoData = errors.New("chart: no data")

// canvas accumulates SVG elements.
type canvas struct {
	b    strings.Builder
	w, h int
}

func newCanvas(o Options, w, h int) *canvas {
	c := &canvas{w: w, h: h}
	fmt.Fprintf(&c.b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" font-family="system-ui, sans-serif" font-size="%d">`, w, h, w, h, fontSize)
	if o.Title != "" {
		fmt.Fprintf(&c.b, `<title>%s</title>`, esc(o.Title))
		c.text(8, 16, "start", "font-weight=\"bold\"", o.Title)
	}
	return c
}

func (c *canvas) text(x, y float64, anchor, attrs, s string) {
	fmt.Fprintf(&c.b, `<text x="%.1f" y="%.1f" text-anchor="%s" fill="#222" %s>%s</text>`, x, y, anchor, attrs, esc(s))
}

func (c *canvas) line(x1, y1, x2, y2 float64, stroke string, width float64) {
	fmt.Fprintf(&c.b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="%.1f"/>`, x1, y1, x2, y2, stroke, width)
}

// rect draws a rectangle; a non-empty title becomes its hover text.
func (c *canvas) rect(x, y, w, h float64, fill, extra, title string) {
	fmt.Fprintf(&c.b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" %s`, x, y, math.Max(w, 0), math.Max(h, 0), fill, extra)
	if title == "" {
		c.b.WriteString("/>")
		return
	}
	fmt.Fprintf(&c.b, `><title>%s</title></rect>`, esc(title))
}

func (c *canvas) circle(x, y, r float64, fill, title string) {
	if title == "" {
		fmt.Fprintf(&c.b, `<circle cx="%.1f" cy="%.1f" r="%.1f" fill="%s" fill-opacity="0.6"/>`, x, y, r, fill)
		return
	}
	fmt.Fprintf(&c.b, `<circle cx="%.1f" cy="%.1f" r="%.1f" fill="%s" fill-opacity="0.6"><title>%s</title></circle>`, x, y, r, fill, esc(title))
}

func (c *canvas) finish(w io.Writer) error {
	c.b.WriteString("</svg>")
	_, err := io.WriteString(w, c.b.String())
	return err
}

func (c *canvas) empty(w io.Writer) error {
	c.text(float64(c.w)/2, float64(c.h)/2, "middle", `fill-opacity="0.6"`, "no data")
	if err := c.finish(w); err != nil {
		return err
	}
	return ErrNoData
}

func esc(s string) string { return html.EscapeString(s) }

func width(o Options) int {
	if o.Width > 0 {
		return o.Width
	}
	return 640
}

// Bars draws horizontal bars, one per entry, labelled on the left with the
// value (and Note) on the right. Negative values are drawn as zero-length.
func Bars(w io.Writer, o Options, bars []Bar) error {
	top := 8
	if o.Title != "" {
		top += titleSpace
	}
	rowH := 22
	h := o.Height
	if h <= 0 {
		h = top + rowH*max(len(bars), 1) + 8
	}
	c := newCanvas(o, width(o), h)
	if len(bars) == 0 {
		return c.empty(w)
	}
	labelW := 0
	valueW := 0
	maxV := 0.0
	for _, b := range bars {
		maxV = math.Max(maxV, math.Abs(b.Value))
	}
	u := unitFor(o, maxV)
	maxV = 0
	for _, b := range bars {
		labelW = max(labelW, len([]rune(b.Label)))
		valueW = max(valueW, len([]rune(u.text(b.Value)+" "+b.Note)))
		maxV = math.Max(maxV, b.Value)
	}
	labelPx := math.Min(float64(labelW*charWidth+12), float64(c.w)*0.4)
	valuePx := math.Min(float64(valueW*charWidth+12), float64(c.w)*0.3)
	plotW := float64(c.w) - labelPx - valuePx - 8
	if maxV <= 0 {
		maxV = 1
	}
	for i, b := range bars {
		y := float64(top + i*rowH)
		c.text(labelPx-6, y+15, "end", "", truncate(b.Label, int(labelPx/charWidth)))
		bw := plotW * math.Max(b.Value, 0) / maxV
		c.rect(labelPx, y+3, bw, float64(rowH-6), palette[0], "", b.Label+": "+u.text(b.Value))
		c.text(labelPx+bw+6, y+15, "start", "", strings.TrimSpace(u.text(b.Value)+" "+b.Note))
	}
	return c.finish(w)
}

// frame is the plot area of a chart with axes.
type frame struct {
	x0, y0, x1, y1         float64 // pixels: left, top, right, bottom
	minX, maxX, minY, maxY float64
	unit                   Unit // of the values
}

func (f frame) px(x float64) float64 {
	if f.maxX == f.minX {
		return (f.x0 + f.x1) / 2
	}
	return f.x0 + (x-f.minX)/(f.maxX-f.minX)*(f.x1-f.x0)
}

func (f frame) py(y float64) float64 {
	if f.maxY == f.minY {
		return f.y1
	}
	return f.y1 - (y-f.minY)/(f.maxY-f.minY)*(f.y1-f.y0)
}

// axes draws the value axis with nice ticks from min(0, minY) and returns the frame.
func axes(c *canvas, o Options, top float64, minY, maxY float64, legendRows int) frame {
	minY = math.Min(0, minY)
	// Ticks are round in the unit shown (1 MiB, not 1,000,000 bytes).
	u := unitFor(o, math.Max(math.Abs(minY), math.Abs(maxY)))
	ticks := niceTicks(minY/u.Size, maxY/u.Size, 5)
	step := ticks[1] - ticks[0]
	labels := make([]string, len(ticks))
	labelW := 0
	for i, t := range ticks {
		labels[i] = tickText(t, step)
		if u.Name != "" {
			labels[i] += " " + u.Name
		}
		labelW = max(labelW, len([]rune(labels[i])))
	}
	minY, maxY = ticks[0]*u.Size, ticks[len(ticks)-1]*u.Size
	f := frame{
		x0: float64(labelW*charWidth + 14), y0: top,
		x1: float64(c.w) - 12, y1: float64(c.h) - 34 - float64(legendRows*16),
		minY: minY, maxY: maxY, unit: u,
	}
	if o.YLabel != "" {
		f.x0 += 14
		fmt.Fprintf(&c.b, `<text x="12" y="%.1f" text-anchor="middle" fill="#222" transform="rotate(-90 12 %.1f)">%s</text>`, (f.y0+f.y1)/2, (f.y0+f.y1)/2, esc(o.YLabel))
	}
	for i, t := range ticks {
		y := f.py(t * u.Size)
		c.line(f.x0, y, f.x1, y, "#ddd", 1)
		c.text(f.x0-4, y+4, "end", "", labels[i])
	}
	c.line(f.x0, f.y1, f.x1, f.y1, "#888", 1)
	if o.XLabel != "" {
		c.text((f.x0+f.x1)/2, f.y1+30, "middle", "", o.XLabel)
	}
	return f
}

// xTicks labels the horizontal axis: at round UTC times (whole minutes,
// hours, days, months, by span) when isTime, else at round numbers.
func xTicks(c *canvas, f frame, isTime bool) {
	n := max(2, int((f.x1-f.x0)/110)) // room for a label each
	var ticks []float64
	var label func(float64) string
	if isTime {
		ticks, label = timeTicks(f.minX, f.maxX, n)
	} else {
		ticks = niceTicks(f.minX, f.maxX, n)
		step := 1.0
		if len(ticks) > 1 {
			step = ticks[1] - ticks[0]
		}
		label = func(v float64) string { return tickText(v, step) }
	}
	for _, t := range ticks {
		if t < f.minX-1e-9 || t > f.maxX+1e-9 {
			continue
		}
		x := f.px(t)
		c.line(x, f.y1, x, f.y1+4, "#888", 1)
		c.text(x, f.y1+16, "middle", "", label(t))
	}
}

func legend(c *canvas, f frame, series []Series) {
	if len(series) < 2 {
		return
	}
	x, y := f.x0, f.y1+(34-6)+16.0
	for i, s := range series {
		wpx := float64(len([]rune(s.Name))*charWidth + 26)
		if x+wpx > float64(c.w) && x > f.x0 {
			x, y = f.x0, y+16
		}
		c.rect(x, y-9, 10, 10, palette[i%len(palette)], "", "")
		c.text(x+14, y, "start", "", s.Name)
		x += wpx
	}
}

func legendRows(c *canvas, series []Series) int {
	if len(series) < 2 {
		return 0
	}
	rows, x := 1, 0
	for _, s := range series {
		wpx := len([]rune(s.Name))*charWidth + 26
		if x+wpx > c.w-60 && x > 0 {
			rows, x = rows+1, 0
		}
		x += wpx
	}
	return rows
}

// Lines draws each series as a polyline over a shared X axis (unix seconds
// shown as clock times when isTime). Points are sorted by X.
func Lines(w io.Writer, o Options, isTime bool, series []Series) error {
	return xy(w, o, isTime, series, true)
}

// Scatter draws each series as dots over a shared X axis.
func Scatter(w io.Writer, o Options, isTime bool, series []Series) error {
	return xy(w, o, isTime, series, false)
}

func xy(w io.Writer, o Options, isTime bool, series []Series, lines bool) error {
	h := o.Height
	if h <= 0 {
		h = 260
	}
	c := newCanvas(o, width(o), h)
	minX, maxX, minY, maxY := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	n := 0
	for _, s := range series {
		for _, p := range s.Points {
			if math.IsNaN(p.X) || math.IsNaN(p.Y) || math.IsInf(p.Y, 0) {
				continue
			}
			minX, maxX = math.Min(minX, p.X), math.Max(maxX, p.X)
			minY, maxY = math.Min(minY, p.Y), math.Max(maxY, p.Y)
			n++
		}
	}
	if n == 0 {
		return c.empty(w)
	}
	top := 10.0
	if o.Title != "" {
		top += titleSpace
	}
	f := axes(c, o, top, minY, maxY, legendRows(c, series))
	f.minX, f.maxX = minX, maxX
	xTicks(c, f, isTime)
	for i, s := range series {
		colour := palette[i%len(palette)]
		pts := append([]Point(nil), s.Points...)
		sort.SliceStable(pts, func(a, b int) bool { return pts[a].X < pts[b].X })
		if lines {
			var path strings.Builder
			for _, p := range pts {
				if math.IsNaN(p.X) || math.IsNaN(p.Y) || math.IsInf(p.Y, 0) {
					continue
				}
				fmt.Fprintf(&path, "%.1f,%.1f ", f.px(p.X), f.py(p.Y))
			}
			fmt.Fprintf(&c.b, `<polyline fill="none" stroke="%s" stroke-width="1.8" points="%s"><title>%s</title></polyline>`, colour, strings.TrimSpace(path.String()), esc(s.Name))
			if len(pts) == 1 {
				c.circle(f.px(pts[0].X), f.py(pts[0].Y), 3, colour, "")
			}
			continue
		}
		for _, p := range pts {
			if math.IsNaN(p.X) || math.IsNaN(p.Y) || math.IsInf(p.Y, 0) {
				continue
			}
			c.circle(f.px(p.X), f.py(p.Y), 2.5, colour, s.Name+": "+f.unit.text(p.Y))
		}
	}
	legend(c, f, series)
	return c.finish(w)
}

// Distribution draws one box plot per group (median, quartiles, whiskers to
// the most extreme sample within 1.5 IQR) with every sample as a dot.
func Distribution(w io.Writer, o Options, groups []Group) error {
	h := o.Height
	if h <= 0 {
		h = 280
	}
	c := newCanvas(o, width(o), h)
	minY, maxY := math.Inf(1), math.Inf(-1)
	for _, g := range groups {
		for _, v := range g.Values {
			if !math.IsNaN(v) && !math.IsInf(v, 0) {
				minY, maxY = math.Min(minY, v), math.Max(maxY, v)
			}
		}
	}
	if len(groups) == 0 || math.IsInf(minY, 1) {
		return c.empty(w)
	}
	top := 10.0
	if o.Title != "" {
		top += titleSpace
	}
	f := axes(c, o, top, minY, maxY, 0)
	slot := (f.x1 - f.x0) / float64(len(groups))
	for i, g := range groups {
		colour := palette[i%len(palette)]
		cx := f.x0 + slot*(float64(i)+0.5)
		c.text(cx, f.y1+16, "middle", "", truncate(g.Label, int(slot/charWidth)))
		vals := make([]float64, 0, len(g.Values))
		for _, v := range g.Values {
			if !math.IsNaN(v) && !math.IsInf(v, 0) {
				vals = append(vals, v)
			}
		}
		if len(vals) == 0 {
			continue
		}
		sort.Float64s(vals)
		q1, med, q3 := Quantile(vals, 0.25), Quantile(vals, 0.5), Quantile(vals, 0.75)
		iqr := q3 - q1
		lo, hi := vals[0], vals[len(vals)-1]
		for _, v := range vals {
			if v >= q1-1.5*iqr {
				lo = v
				break
			}
		}
		for j := len(vals) - 1; j >= 0; j-- {
			if vals[j] <= q3+1.5*iqr {
				hi = vals[j]
				break
			}
		}
		bw := math.Min(slot*0.5, 60)
		c.line(cx, f.py(lo), cx, f.py(q1), "#555", 1)
		c.line(cx, f.py(q3), cx, f.py(hi), "#555", 1)
		c.line(cx-bw/4, f.py(lo), cx+bw/4, f.py(lo), "#555", 1)
		c.line(cx-bw/4, f.py(hi), cx+bw/4, f.py(hi), "#555", 1)
		summary := fmt.Sprintf("%s: n=%d median %s, IQR %s-%s", g.Label, len(vals), f.unit.text(med), f.unit.text(q1), f.unit.text(q3))
		c.rect(cx-bw/2, f.py(q3), bw, f.py(q1)-f.py(q3), colour, `fill-opacity="0.25" stroke="`+colour+`"`, summary)
		c.line(cx-bw/2, f.py(med), cx+bw/2, f.py(med), colour, 2.5)
		// Dots spread deterministically across the box width, so a redraw
		// of the same data is byte-identical.
		for j, v := range vals {
			offset := (float64((j*7919)%97)/96 - 0.5) * bw * 0.8
			c.circle(cx+offset, f.py(v), 1.8, colour, "")
		}
	}
	return c.finish(w)
}

// Quantile returns the q-quantile (0..1) of sorted values by linear
// interpolation between closest ranks; NaN for no values.
func Quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	pos := q * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := int(math.Ceil(pos))
	return sorted[lo] + (sorted[hi]-sorted[lo])*(pos-float64(lo))
}

// niceTicks returns about n round tick values covering [lo, hi].
func niceTicks(lo, hi float64, n int) []float64 {
	if hi <= lo {
		if hi == 0 {
			return []float64{0, 1}
		}
		lo, hi = math.Min(lo, 0), math.Max(hi, 0)
		if hi == lo {
			hi = lo + 1
		}
	}
	raw := (hi - lo) / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	start := math.Floor(lo/step) * step
	var ticks []float64
	// The last tick is the first one at or above hi, so the data fits.
	for i := 0; i < 50; i++ {
		v := math.Round((start+float64(i)*step)/step) * step
		ticks = append(ticks, v)
		if v >= hi-step*1e-9 && len(ticks) >= 2 {
			break
		}
	}
	return ticks
}

// trimFloat prints a value with about three significant digits (all the
// integer digits of a large one), never in scientific notation: below
// 0.000001 it is 0.
func trimFloat(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 100 || a < 5e-7:
		return strconv.FormatFloat(math.Round(v)+0, 'f', -1, 64)
	case a >= 10:
		return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64)
	case a >= 1:
		return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64)
	}
	// Three significant digits after the leading zeros, trailing zeros cut.
	decimals := min(2-int(math.Floor(math.Log10(a))), 6)
	s := strconv.FormatFloat(v, 'f', decimals, 64)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}

func truncate(s string, n int) string {
	r := []rune(s)
	if n < 2 || len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
