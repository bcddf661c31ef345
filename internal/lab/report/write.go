package report

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"packwire/internal/lab/bench"
)

// Files the report writes into its directory.
const (
	SamplesJSON = "samples.json"
	SamplesCSV  = "samples.csv"
	ReportHTML  = "report.html"
)

// WriteText prints the run's header, the study's tables and the findings.
func WriteText(w io.Writer, res *bench.Result) error {
	sums := Summarize(res)
	m := res.Meta
	fmt.Fprintf(w, "packwire bench: %s (branch %s), git %s, protocol v%d, %d user(s), %s per scenario\n",
		m.URL, m.Branch, m.GitVersion, m.Protocol, m.Users, perScenario(m))
	if m.Target != "" {
		fmt.Fprintf(w, "target: %s\n", m.Target)
	}
	fmt.Fprintf(w, "server CPU: %s\n\n", m.ServerCost)
	for _, t := range tables(sums) {
		fmt.Fprintln(w, t.Title)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, strings.Join(t.Header, "\t")+"\t")
		for _, r := range t.Rows {
			fmt.Fprintln(tw, strings.Join(r, "\t")+"\t")
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, n := range t.Notes {
			fmt.Fprintln(w, n)
		}
		fmt.Fprintln(w)
	}
	for _, f := range findings(res, sums) {
		fmt.Fprintln(w, f)
	}
	return nil
}

func perScenario(m bench.Meta) string {
	if m.Iterations > 0 {
		return fmt.Sprintf("%d operations per user", m.Iterations)
	}
	return m.Duration
}

// Write writes samples.json, samples.csv and report.html into dir (created
// if needed) and returns the report's path.
func Write(dir string, res *bench.Result) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if err := writeFile(filepath.Join(dir, SamplesJSON), func(w io.Writer) error {
		enc := json.NewEncoder(w)
		enc.SetIndent("", " ")
		return enc.Encode(res)
	}); err != nil {
		return "", err
	}
	if err := writeFile(filepath.Join(dir, SamplesCSV), func(w io.Writer) error { return WriteCSV(w, res) }); err != nil {
		return "", err
	}
	path := filepath.Join(dir, ReportHTML)
	if err := writeFile(path, func(w io.Writer) error { return WriteHTML(w, res) }); err != nil {
		return "", err
	}
	return path, nil
}

// ReadJSON reads a samples.json back.
func ReadJSON(path string) (*bench.Result, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var res bench.Result
	if err := json.Unmarshal(b, &res); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &res, nil
}

// writeFile writes through a temporary file so a reader (the dashboard)
// never sees half a report.
func writeFile(path string, fill func(io.Writer) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := fill(f); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	os.Chmod(f.Name(), 0o644)
	return os.Rename(f.Name(), path)
}

// CSVHeader are the columns of samples.csv.
var CSVHeader = []string{"scenario", "user", "seq", "start", "wall_ms", "reset_ms", "bytes", "reset_bytes",
	"client_cpu_ms", "server_cpu_ms", "result", "error", "tip"}

// WriteCSV writes one row per operation; empty cells are not measured.
func WriteCSV(w io.Writer, res *bench.Result) error {
	cw := csv.NewWriter(w)
	cw.Write(CSVHeader)
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }
	for _, s := range res.Samples {
		reset, resetBytes, server := "", "", ""
		if s.ResetMS != nil {
			reset = f(*s.ResetMS)
		}
		if s.ResetBytes != nil {
			resetBytes = strconv.FormatInt(*s.ResetBytes, 10)
		}
		if s.ServerCPUMS != nil {
			server = f(*s.ServerCPUMS)
		}
		cw.Write([]string{s.Scenario, strconv.Itoa(s.User), strconv.Itoa(s.Seq), s.Start.UTC().Format(time.RFC3339Nano),
			f(s.WallMS), reset, strconv.FormatInt(s.Bytes, 10), resetBytes, f(s.ClientCPUMS), server, s.Result, s.Error, s.Tip})
	}
	cw.Flush()
	return cw.Error()
}
