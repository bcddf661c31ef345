package sizer

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// line is a row of the table: a section header (m nil) or a figure.
type line struct {
	indent int
	name   string
	m      *Metric
	binary bool // a size in bytes
}

func (r *Report) lines() []line {
	o, b, h, c := &r.Overall, &r.Biggest, &r.History, &r.Checkout
	return []line{
		{0, "Overall repository size", nil, false},
		{1, "Commits", nil, false},
		{2, "Count", &o.CommitCount, false},
		{2, "Total size", &o.CommitSize, true},
		{1, "Trees", nil, false},
		{2, "Count", &o.TreeCount, false},
		{2, "Total size", &o.TreeSize, true},
		{2, "Total tree entries", &o.TreeEntries, false},
		{1, "Blobs", nil, false},
		{2, "Count", &o.BlobCount, false},
		{2, "Total size", &o.BlobSize, true},
		{1, "Annotated tags", nil, false},
		{2, "Count", &o.TagCount, false},
		{1, "References", nil, false},
		{2, "Count", &o.RefCount, false},
		{},
		{0, "Biggest objects", nil, false},
		{1, "Commits", nil, false},
		{2, "Maximum size", &b.CommitSize, true},
		{2, "Maximum parents", &b.Parents, false},
		{1, "Trees", nil, false},
		{2, "Maximum entries", &b.TreeEntries, false},
		{1, "Blobs", nil, false},
		{2, "Maximum size", &b.BlobSize, true},
		{},
		{0, "History structure", nil, false},
		{1, "Maximum history depth", &h.Depth, false},
		{1, "Maximum tag depth", &h.TagDepth, false},
		{},
		{0, "Biggest checkouts", nil, false},
		{1, "Number of directories", &c.Directories, false},
		{1, "Maximum path depth", &c.PathDepth, false},
		{1, "Maximum path length", &c.PathLength, true},
		{1, "Number of files", &c.Files, false},
		{1, "Total size of files", &c.FileSize, true},
		{1, "Number of symlinks", &c.Symlinks, false},
		{1, "Number of submodules", &c.Submodules, false},
	}
}

// WriteTable writes the report as git-sizer's table: every figure with its
// level of concern (one star per threshold reached, "!" x 30 past 30),
// the objects behind the biggest figures as footnotes. Figures whose
// concern is below minConcern are left out (0 shows all).
func (r *Report) WriteTable(w io.Writer, minConcern float64) error {
	var out strings.Builder
	o := &r.Overall
	fmt.Fprintf(&out, "%s: %s objects, %s on disk, %d branches, %d tags\n\n", r.Repository,
		strings.TrimSpace(human(o.CommitCount.Value+o.TreeCount.Value+o.BlobCount.Value+o.TagCount.Value, false)),
		strings.TrimSpace(human(o.DiskSize, true)), o.Branches, o.Tags)
	out.WriteString("| Name                         | Value     | Level of concern               |\n")
	out.WriteString("| ---------------------------- | --------- | ------------------------------ |\n")
	var notes []string
	noteOf := map[string]int{}
	lines := r.lines()
	for i, l := range lines {
		if l.m == nil && l.name == "" {
			out.WriteString("|                              |           |                                |\n")
			continue
		}
		if l.m == nil {
			if !sectionShown(lines[i+1:], l.indent, minConcern) {
				continue
			}
			row(&out, l.indent, l.name, "", "")
			continue
		}
		if l.m.Concern < minConcern {
			continue
		}
		cite := ""
		if l.m.Object != "" {
			note := l.m.Object
			if l.m.Name != "" {
				note += " (" + l.m.Name + ")"
			}
			n, ok := noteOf[note]
			if !ok {
				notes = append(notes, note)
				n = len(notes)
				noteOf[note] = n
			}
			cite = fmt.Sprintf(" [%d]", n)
		}
		row(&out, l.indent, l.name+cite, human(l.m.Value, l.binary), stars(l.m.Concern))
	}
	if len(notes) > 0 {
		out.WriteByte('\n')
		for i, n := range notes {
			fmt.Fprintf(&out, "[%d] %s\n", i+1, n)
		}
	}
	_, err := io.WriteString(w, out.String())
	return err
}

// sectionShown says whether a section header has a figure to show below it.
func sectionShown(rest []line, indent int, minConcern float64) bool {
	for _, l := range rest {
		if l.indent <= indent && (l.m == nil) {
			return false
		}
		if l.m != nil && l.m.Concern >= minConcern {
			return true
		}
	}
	return false
}

func row(out *strings.Builder, indent int, name, value, concern string) {
	prefix := ""
	if indent > 0 {
		prefix = strings.Repeat("  ", indent-1) + "* "
	}
	fmt.Fprintf(out, "| %-28s | %9s | %-30s |\n", prefix+name, value, concern)
}

// stars renders a level of concern as git-sizer does.
func stars(concern float64) string {
	switch {
	case concern > 30:
		return strings.Repeat("!", 30)
	case concern >= 1:
		return strings.Repeat("*", int(concern))
	}
	return ""
}

// human writes n with three significant digits and a metric prefix
// (k, M, G) or, for sizes, a binary one (KiB, MiB, GiB).
func human(n int64, binary bool) string {
	base, units := 1000.0, []string{"", "k", "M", "G", "T"}
	unit := " "
	if binary {
		base, units, unit = 1024, []string{"B", "KiB", "MiB", "GiB", "TiB"}, ""
	}
	v := float64(n)
	i := 0
	for v >= base && i < len(units)-1 {
		v /= base
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%d %-3s", n, units[0]+unit)
	}
	digits := 2
	if v >= 100 {
		digits = 0
	} else if v >= 10 {
		digits = 1
	}
	return fmt.Sprintf("%.*f %-3s", digits, v, units[i])
}
