package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"packwire/internal/datadir"
	"packwire/internal/governor"
	"packwire/internal/store"
	"packwire/internal/units"
)

func cmdGovernor(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	tail := len(args) > 0 && args[0] == "tail"
	maintenance := len(args) > 0 && args[0] == "maintenance"
	if tail || maintenance {
		args = args[1:]
	}
	fs := newFlagSet("governor", "governor [--since DUR] [--by repo|user|kind|transport|service|result|node|version] [--top N] [--node NAME] [--json] [--database URL]\n       packwire governor --last N [--node NAME] [--json]\n       packwire governor tail [--node NAME] [--json]\n       packwire governor maintenance [--repo NAME] [--last N] [--json]",
		`Show what requests cost: count, wall time percentiles (p50/p95/p99),
git CPU in total and per request (user+system of git and the children it
waited for: pack-objects, hooks; with --pack-cache, a shared pack-objects
run is charged to the request that started it), and bytes sent, grouped
and sorted by CPU.
"governor tail" prints records as they are written, until Ctrl-C.
"governor maintenance" lists the latest maintenance runs (newest first):
what kind, why, what they cost, and the packs and bytes before and after.
In a cluster (--database postgres://...) every node writes its records to
PostgreSQL: this shows the whole cluster, each record with its node
(--by node, --node NAME for one node's).`, stderr)
	dir := dataFlag(fs)
	since := fs.Duration("since", 24*time.Hour, "summarise requests that started within this long")
	by := fs.String("by", "kind", "group by repo, user, kind, transport, service, result, node or version (the packwire build)")
	node := fs.String("node", "", "summaries, --last and tail: only the records of this cluster node")
	database := fs.String("database", datadir.Database(), "read a cluster's records, every node's, from PostgreSQL: postgres://USER@HOST/DB (serve's --database); default: governor.db in --data ($"+datadir.EnvDatabase+" sets the default)")
	top := fs.Int("top", 20, "show at most this many groups")
	last := fs.Int("last", 0, "print the last N raw records instead of a summary (maintenance: default 20)")
	repoName := fs.String("repo", "", "maintenance: only this repository")
	asJSON := fs.Bool("json", false, "machine-readable output")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(args, pos, 0, 0, "governor [tail|maintenance] [FLAGS]"); err != nil {
		return err
	}
	if _, ok := governor.GroupBy[*by]; !ok {
		return usagef("--by %s: one of repo, user, kind, transport, service, result, node", *by)
	}
	if maintenance && *node != "" {
		return usagef("--node: governor maintenance lists every node's runs, each with its node")
	}
	if *database != "" && !store.IsPostgresURL(*database) {
		return usagef("--database %s: not a postgres:// URL (leave it out for governor.db in the data directory)", store.RedactDatabaseURL(*database))
	}
	if *database == "" {
		// The cluster's records need no data directory; one server's do.
		if ok, err := datadir.Exists(*dir); err != nil {
			return err
		} else if !ok {
			abs, _ := filepath.Abs(*dir)
			return &datadir.NoDataError{Dir: abs}
		}
		path := filepath.Join(*dir, governor.FileName)
		if _, err := os.Stat(path); err != nil {
			return fmt.Errorf("no request records at %s yet (packwire serve writes them)", path)
		}
	}
	gov, err := governor.OpenIn(ctx, *dir, *database)
	if err != nil {
		return err
	}
	defer gov.Close()
	filter := governor.Filter{Node: *node}

	switch {
	case maintenance:
		n := *last
		if n <= 0 {
			n = 20
		}
		runs, err := gov.LastMaintenance(ctx, *repoName, n)
		if err != nil {
			return err
		}
		return printMaintenance(stdout, runs, *asJSON)
	case tail:
		return tailRecords(ctx, gov, filter, stdout, *asJSON)
	case *last > 0:
		recs, err := gov.LastWhere(ctx, *last, filter)
		if err != nil {
			return err
		}
		return printRecords(stdout, recs, *asJSON)
	}
	groups, err := gov.SummarizeWhere(ctx, time.Now().Add(-*since), *by, *top, filter)
	if err != nil {
		return err
	}
	if *asJSON {
		out := map[string]any{"since": time.Now().Add(-*since).UTC(), "by": *by, "groups": groups}
		if *node != "" {
			out["node"] = *node
		}
		return writeJSON(stdout, out)
	}
	if len(groups) == 0 {
		fmt.Fprintf(stdout, "no requests in the last %s\n", *since)
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%s\tcount\tp50 wall\tp95 wall\tp99 wall\tgit CPU\tCPU/req\tbytes out\terrors\t\n", strings.ToUpper(*by))
	for _, g := range groups {
		key := g.Key
		if key == "" {
			key = "(anonymous)"
			if *by == "node" {
				key = "(no node)" // recorded by a server outside a cluster
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t\n", key, g.Count, ms(g.P50), ms(g.P95), ms(g.P99),
			ms(g.CPU), ms(g.CPUPerReq), bytesText(g.BytesOut), g.Errors)
	}
	return tw.Flush()
}

func tailRecords(ctx context.Context, gov *governor.Governor, filter governor.Filter, out io.Writer, asJSON bool) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
	defer stop()
	seq, err := gov.LastSeq(ctx)
	if err != nil {
		return err
	}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		recs, next, err := gov.After(ctx, seq, time.Time{}, 1000)
		if err != nil {
			return err
		}
		seq = next
		if filter.Node != "" { // the cursor moves over every record
			recs = slices.DeleteFunc(recs, func(r governor.Record) bool { return r.Node != filter.Node })
		}
		if err := printRecords(out, recs, asJSON); err != nil {
			return err
		}
	}
}

func printRecords(out io.Writer, recs []governor.Record, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(out)
		for _, r := range recs {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
		return nil
	}
	for _, r := range recs {
		user := r.User
		if user == "" {
			user = "anonymous"
		}
		fmt.Fprintf(out, "%s %s %-5s v%d %-16s %-18s %-12s wall=%s cpu=%s out=%s result=%s", r.Start.Format("15:04:05.000"), r.ID,
			r.Transport, r.Protocol, r.Repo, r.Kind, user, ms(time.Duration(r.Wall)), ms(r.CPU()), bytesText(r.BytesOut), r.Result)
		if r.Node != "" {
			fmt.Fprintf(out, " node=%s", r.Node)
		}
		if r.Error != "" {
			fmt.Fprintf(out, " error=%q", firstLine(r.Error))
		}
		fmt.Fprintln(out)
	}
	return nil
}

func ms(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
	return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
}

func bytesText(n int64) string {
	return units.Bytes(n)
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

func printMaintenance(out io.Writer, runs []governor.MaintenanceRun, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(out)
		for _, r := range runs {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
		return nil
	}
	if len(runs) == 0 {
		fmt.Fprintln(out, "no maintenance runs recorded")
		return nil
	}
	// A cluster's runs say whose copy they maintained.
	nodes := slices.ContainsFunc(runs, func(r governor.MaintenanceRun) bool { return r.Node != "" })
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	if nodes {
		fmt.Fprint(tw, "NODE\t")
	}
	fmt.Fprintln(tw, "START\tREPO\tKIND\tRESULT\tWALL\tGIT CPU\tPACKS\tBYTES\tREASON")
	for _, r := range runs {
		result := r.Result
		if r.Error != "" {
			result += ": " + r.Error
		}
		if nodes {
			fmt.Fprintf(tw, "%s\t", r.Node)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d -> %d\t%s -> %s\t%s\n", r.Start.UTC().Format("2006-01-02 15:04:05"), r.Repo, r.Kind, result,
			ms(r.Wall), ms(r.UserCPU+r.SysCPU), r.PacksBefore, r.PacksAfter, bytesText(r.BytesBefore), bytesText(r.BytesAfter), r.Reason)
	}
	return tw.Flush()
}
