package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"packwire/internal/lab/compare"
)

// report collects the Markdown of bench/RESULTS.md: sections with tables,
// and every target of the issue with the figure that meets or misses it.
type report struct {
	head    strings.Builder
	body    strings.Builder
	targets []string
}

func (r *report) header(s *setup) {
	fmt.Fprintf(&r.head, "# packwire against the servers users run today\n\n")
	fmt.Fprintf(&r.head, "Command (as root, from the repository root): `go run ./bench/peers %s`\n\n", strings.Join(os.Args[1:], " "))
	fmt.Fprintf(&r.head, "- Date: %s\n- Machine: %s\n- Repository: %s\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), machine(), s.repoInfo)
	fmt.Fprintf(&r.head, "- Servers, all on 127.0.0.1 over the same bare repositories, each in its own cgroup v1 (cpuacct + memory) so server CPU covers every process it starts:\n")
	fmt.Fprintf(&r.head, "  packwire serve (defaults except `--maintain-interval 0 --max-connections 5000`); `git-daemon --export-all` (its defaults); nginx (2 workers) + `fcgiwrap -c 64` + git-http-backend (GIT_PROTOCOL passed); OpenSSH sshd + git (key auth as a uid-0 account whose shell is git-shell and whose home is empty, `MaxStartups 4000`).\n")
	fmt.Fprintf(&r.head, "- Client: git with an isolated HOME and GIT_CONFIG_NOSYSTEM=1, protocol v2 (git's default), the OpenSSH client with its default cipher for both SSH servers.\n")
	fmt.Fprintf(&r.head, "- The repository was put in packwire's maintained layout (`packwire maintain`) once before the run; every server serves those same files.\n")
	fmt.Fprintf(&r.head, "- Ratios are packwire / peer (below 1: packwire is faster or cheaper), median of per-pair ratios with a 95%% bootstrap confidence interval (`internal/lab/compare`, the statistics of `packwire compare`).\n\n")
}

func (r *report) section(title, text string) {
	fmt.Fprintf(&r.body, "\n## %s\n\n%s\n\n", title, text)
}

// table starts a table, after a blank line: Markdown would read a table
// right under another as more of its rows.
func (r *report) table(header, sep string) {
	if !strings.HasSuffix(r.body.String(), "\n\n") {
		r.body.WriteString("\n")
	}
	fmt.Fprintf(&r.body, "%s\n%s\n", header, sep)
}

func (r *report) row(cells ...string) { fmt.Fprintf(&r.body, "| %s |\n", strings.Join(cells, " | ")) }

func (r *report) note(text string) { fmt.Fprintf(&r.body, "\n%s\n", text) }

// target records one of the targets: met when value <= limit.
func (r *report) target(what string, value, limit float64, res compare.Result) {
	verdict := "**met**"
	if value > limit {
		verdict = "**missed**"
	}
	figure := fmt.Sprintf("%.3g", value)
	if res.Pairs > 0 {
		figure = ratioCI(res)
	}
	r.targets = append(r.targets, fmt.Sprintf("| %s | %s | %s |", what, figure, verdict))
}

func (r *report) String() string {
	var b strings.Builder
	b.WriteString(r.head.String())
	b.WriteString("## Targets\n\n| target | measured | |\n|---|---:|---|\n")
	for _, t := range r.targets {
		b.WriteString(t + "\n")
	}
	b.WriteString(r.body.String())
	return b.String()
}

func secs(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }
func ms(d time.Duration) string   { return fmt.Sprintf("%.1f ms", float64(d)/1e6) }
func ratio(x float64) string      { return fmt.Sprintf("%.2fx", x) }

// ratioCI prints a median ratio with its interval and the verdict's p-value.
func ratioCI(res compare.Result) string {
	return fmt.Sprintf("%.3fx (%.3f-%.3f)", res.MedianRatio, res.CILow, res.CIHigh)
}
