package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"packwire/internal/datadir"
	"packwire/internal/repo"
	"packwire/internal/server/cluster"
	"packwire/internal/store"
)

const clusterNote = `A cluster is several "packwire serve --database postgres://... --node NAME"
sharing one PostgreSQL store. Each repository lives on --replicas nodes, one
of them its primary; a push is acknowledged once a majority of the replicas
hold it and its generation is committed in PostgreSQL.`

func cmdClusterStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "cluster status [--json] [--node-timeout D] [--database URL]"
	var asJSON bool
	var timeout time.Duration
	data, pos, err := openData(ctx, "cluster status", syn, "Show the cluster's nodes (name, URL, healthy, last heartbeat) and, for each\nrepository, its primary, generation and replicas with theirs.\n\n"+clusterNote, args, stderr,
		func(fs *flag.FlagSet) {
			fs.BoolVar(&asJSON, "json", false, "machine-readable output")
			fs.DurationVar(&timeout, "node-timeout", cluster.DefaultNodeTimeout, "a node whose heartbeat is older is shown unhealthy (as serve's --node-timeout)")
		})
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 0, 0, syn); err != nil {
		return err
	}
	st, err := cluster.ReadStatus(ctx, data.Store.DB, timeout)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(stdout, st)
	}
	if len(st.Nodes) == 0 {
		fmt.Fprintln(stdout, "no nodes yet (packwire serve --database URL --node NAME)")
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tURL\tHEALTHY\tLAST HEARTBEAT\tPRIMARIES\tREPLICAS")
	for _, n := range st.Nodes {
		fmt.Fprintf(tw, "%s\t%s\t%v\t%s ago\t%d\t%d\n", n.Name, n.URL, n.Healthy, n.HeartbeatAge, n.Primaries, n.Replicas)
	}
	tw.Flush()
	if len(st.Repos) == 0 {
		return nil
	}
	fmt.Fprintln(stdout)
	tw = tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "REPOSITORY\tPRIMARY\tGENERATION\tREPLICAS (node:generation, * stale, ! unhealthy)")
	for _, r := range st.Repos {
		var reps []string
		for _, rp := range r.Replicas {
			mark := ""
			if rp.Generation != r.Generation {
				mark += "*"
			}
			if !rp.Healthy {
				mark += "!"
			}
			reps = append(reps, fmt.Sprintf("%s:%d%s", rp.Node, rp.Generation, mark))
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", r.Name, r.Primary, r.Generation, strings.Join(reps, " "))
	}
	return tw.Flush()
}

// placeInCluster records a new repository in the cluster when the store
// is a cluster's (PostgreSQL with nodes): the nodes create their copies.
// It tells whether it did.
func placeInCluster(ctx context.Context, data *datadir.Data, name string, replicas int, stdout io.Writer) (bool, error) {
	if data.Store.DB.Engine != store.Postgres {
		return false, nil
	}
	var nodes int
	var err error
	if err = data.Store.DB.QueryRowContext(ctx, "SELECT count(*) FROM nodes").Scan(&nodes); err != nil || nodes == 0 {
		return false, err
	}
	if name, err = repo.CleanName(name); err != nil {
		return true, err
	}
	p, err := cluster.Place(ctx, data.Store.DB, name, replicas, cluster.DefaultNodeTimeout)
	if err != nil {
		return true, err
	}
	var names []string
	for _, r := range p.Replicas {
		names = append(names, r.Node)
	}
	fmt.Fprintf(stdout, "placed %s on %s (primary %s); each node creates its copy within a heartbeat\n", name, strings.Join(names, ", "), p.Primary)
	return true, nil
}
