package chart

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"strings"
	"testing"
)

// wellFormed parses the SVG as XML and returns the element names it holds.
func wellFormed(t *testing.T, svg string) map[string]int {
	t.Helper()
	names := map[string]int{}
	d := xml.NewDecoder(strings.NewReader(svg))
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, svg)
		}
		if se, ok := tok.(xml.StartElement); ok {
			names[se.Name.Local]++
		}
	}
	for _, bad := range []string{"<script", "href=", "url(", "@import"} {
		if strings.Contains(svg, bad) {
			t.Fatalf("SVG contains %q: it must be self-contained", bad)
		}
	}
	return names
}

func draw(t *testing.T, f func(w io.Writer) error) string {
	t.Helper()
	var b bytes.Buffer
	if err := f(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestBars(t *testing.T) {
	svg := draw(t, func(w io.Writer) error {
		return Bars(w, Options{Title: "CPU by repo <&>", Unit: "s"}, []Bar{
			{Label: "team/app", Value: 12.5, Note: "(41%)"},
			{Label: "a<b>\"c\"", Value: 3},
			{Label: "negative", Value: -1},
		})
	})
	names := wellFormed(t, svg)
	if names["rect"] != 3 {
		t.Fatalf("want 3 bars, got %d rects", names["rect"])
	}
	if !strings.Contains(svg, "12.5 s (41%)") || !strings.Contains(svg, "CPU by repo &lt;&amp;&gt;") {
		t.Fatalf("values or escaped title missing:\n%s", svg)
	}
	// The longest bar is the largest value.
	if !strings.Contains(svg, `width="`) {
		t.Fatal("no widths")
	}
}

func TestLinesScatterDistribution(t *testing.T) {
	series := []Series{
		{Name: "requests", Points: []Point{{1700000000, 3}, {1700000060, 5}, {1700000030, math.NaN()}, {1700000120, 1}}},
		{Name: "cpu", Points: []Point{{1700000000, 0.5}, {1700000120, 2}}},
	}
	for name, f := range map[string]func(io.Writer) error{
		"lines":   func(w io.Writer) error { return Lines(w, Options{Title: "t", YLabel: "n"}, true, series) },
		"scatter": func(w io.Writer) error { return Scatter(w, Options{Unit: "ms"}, false, series) },
		"dist": func(w io.Writer) error {
			return Distribution(w, Options{Unit: "ms"}, []Group{
				{Label: "T1", Values: []float64{10, 11, 12, 13, 100}},
				{Label: "T2", Values: []float64{1}},
				{Label: "empty"},
			})
		},
	} {
		svg := draw(t, f)
		names := wellFormed(t, svg)
		switch name {
		case "lines":
			if names["polyline"] != 2 || !strings.Contains(svg, ">requests<") {
				t.Fatalf("lines: want 2 polylines and a legend:\n%s", svg)
			}
		case "scatter":
			if names["circle"] != 5 {
				t.Fatalf("scatter: want 5 dots (NaN skipped), got %d", names["circle"])
			}
		case "dist":
			if names["circle"] != 6 || !strings.Contains(svg, "n=5 median 12 ms") {
				t.Fatalf("distribution: dots %d\n%s", names["circle"], svg)
			}
		}
		if again := draw(t, f); again != svg {
			t.Fatalf("%s: the same data drew differently", name)
		}
	}
}

func TestNoData(t *testing.T) {
	var b bytes.Buffer
	if err := Lines(&b, Options{}, true, nil); !errors.Is(err, ErrNoData) {
		t.Fatalf("want ErrNoData, got %v", err)
	}
	wellFormed(t, b.String())
	if !strings.Contains(b.String(), "no data") {
		t.Fatal("an empty chart must say so")
	}
}

func TestNiceTicksAndQuantile(t *testing.T) {
	ticks := niceTicks(0, 97, 5)
	if ticks[0] != 0 || ticks[len(ticks)-1] < 97 || len(ticks) > 8 {
		t.Fatalf("ticks %v", ticks)
	}
	if got := niceTicks(5, 5, 5); len(got) < 2 {
		t.Fatalf("flat data ticks %v", got)
	}
	if q := Quantile([]float64{1, 2, 3, 4}, 0.5); q != 2.5 {
		t.Fatalf("median of 1..4 = %v", q)
	}
}

// Time labels never repeat: their precision follows the tick step.
func TestTimeTicksDistinct(t *testing.T) {
	for _, span := range []float64{30, 200, 300, 900, 5000, 3 * 86400} {
		start := 1700000000.0
		svg := draw(t, func(w io.Writer) error {
			return Scatter(w, Options{}, true, []Series{{Name: "a", Points: []Point{{start, 1}, {start + span, 2}}}})
		})
		seen := map[string]bool{}
		for _, part := range strings.Split(svg, `text-anchor="middle" fill="#222" >`)[1:] {
			label := part[:strings.Index(part, "<")]
			if seen[label] {
				t.Fatalf("span %v s: tick label %q repeats\n%s", span, label, svg)
			}
			seen[label] = true
		}
	}
}
