package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"packwire/internal/datadir"
	"packwire/internal/lfs"
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
func placeInCluster(ctx context.Context, data *datadir.Data, name, source string, replicas int, stdout io.Writer) (bool, error) {
	return placeMirrorInCluster(ctx, data, name, source, "", replicas, stdout)
}

// placeMirrorInCluster is placeInCluster with the repository's mirroring
// (a mirror.Spec as JSON; "": none).
func placeMirrorInCluster(ctx context.Context, data *datadir.Data, name, source, spec string, replicas int, stdout io.Writer) (bool, error) {
	clustered, err := inCluster(ctx, data)
	if err != nil || !clustered {
		return false, err
	}
	if name, err = repo.CleanName(name); err != nil {
		return true, err
	}
	p, err := cluster.PlaceMirror(ctx, data.Store.DB, name, source, spec, replicas, cluster.DefaultNodeTimeout)
	if err != nil {
		return true, err
	}
	var names []string
	for _, r := range p.Replicas {
		names = append(names, r.Node)
	}
	if source != "" {
		fmt.Fprintf(stdout, "placed %s on %s (primary %s); the primary imports it, then the others copy it\n", name, strings.Join(names, ", "), p.Primary)
		return true, nil
	}
	// A new repository takes pushes once a majority of its copies are
	// made: wait for them (nodes make theirs within a heartbeat), so that
	// a script's push right after repo create is not refused.
	made, err := cluster.AwaitCopies(ctx, data.Store.DB, name, 10*time.Second)
	if err != nil {
		return true, err
	}
	if made == len(p.Replicas) {
		fmt.Fprintf(stdout, "placed %s on %s (primary %s); every copy is made\n", name, strings.Join(names, ", "), p.Primary)
	} else {
		fmt.Fprintf(stdout, "placed %s on %s (primary %s); %d of %d copies made so far, the others when their nodes next reconcile (packwire cluster status)\n",
			name, strings.Join(names, ", "), p.Primary, made, len(p.Replicas))
	}
	return true, nil
}

// clusterRepo tells whether the store is a cluster's and, if so, cleans
// the repository name a command was given.
func clusterRepo(ctx context.Context, data *datadir.Data, raw string) (name string, clustered bool, err error) {
	if clustered, err = inCluster(ctx, data); err != nil || !clustered {
		return "", false, err
	}
	name, err = repo.CleanName(raw)
	return name, true, err
}

// placedOnly words the cluster's ErrNotPlaced as the not found a command
// on one server gives.
func placedOnly(err error) error {
	if errors.Is(err, cluster.ErrNotPlaced) {
		return fmt.Errorf("%w (packwire cluster status lists the cluster's)", repo.ErrNotFound)
	}
	return err
}

// deleteInCluster deletes a repository from the cluster, if the store is
// a cluster's: every node answers "not found" at once, and each node that
// held a copy moves it into its own trash when it next runs.
func deleteInCluster(ctx context.Context, data *datadir.Data, raw string, stdout, stderr io.Writer) (bool, error) {
	name, clustered, err := clusterRepo(ctx, data, raw)
	if err != nil || !clustered {
		return clustered, err
	}
	nodes, err := cluster.DeleteWith(ctx, data.Store.DB, name, lfs.ClusterRows{})
	if err != nil {
		return true, placedOnly(err)
	}
	recordRepoChange(ctx, data, stderr, "repo delete", name, "deleted from the cluster; copies to the trash on "+strings.Join(nodes, ", "))
	fmt.Fprintf(stdout, "deleted %s from the cluster: every node answers not found; %s move their copies into their trash within a heartbeat\n",
		name, strings.Join(nodes, ", "))
	return true, nil
}

// renameInCluster renames a repository in the cluster, if the store is a
// cluster's: every node answers for the new name at once, moving its copy
// before it serves it.
func renameInCluster(ctx context.Context, data *datadir.Data, rawFrom, rawTo string, stdout, stderr io.Writer) (from, to string, renamed bool, err error) {
	from, clustered, err := clusterRepo(ctx, data, rawFrom)
	if err != nil || !clustered {
		return "", "", clustered, err
	}
	if to, err = repo.CleanName(rawTo); err != nil {
		return "", "", true, fmt.Errorf("%q: %w", rawTo, err)
	}
	nodes, err := cluster.RenameWith(ctx, data.Store.DB, from, to, lfs.ClusterRows{})
	if errors.Is(err, cluster.ErrNotPlaced) {
		// On this machine's disk only (made before it joined): renamed
		// there, as on one server.
		return "", "", false, nil
	}
	if err != nil {
		return "", "", true, err
	}
	recordRepoChange(ctx, data, stderr, "repo rename", from, "to "+to+" in the cluster; copies on "+strings.Join(nodes, ", "))
	fmt.Fprintf(stdout, "renamed %s to %s in the cluster: every node answers for %s; %s move their copies when they next serve it or within a heartbeat\n",
		from, to, to, strings.Join(nodes, ", "))
	return from, to, true, nil
}

// restoreInCluster restores a repository deleted from the cluster, if the
// store is a cluster's: placed again on the nodes whose trash holds a
// copy, each of which brings its copy back before it serves it.
func restoreInCluster(ctx context.Context, data *datadir.Data, raw, at string, stdout, stderr io.Writer) (bool, error) {
	name, clustered, err := clusterRepo(ctx, data, raw)
	if err != nil || !clustered {
		return clustered, err
	}
	p, err := cluster.RestoreWith(ctx, data.Store.DB, name, at, lfs.ClusterRows{})
	if err != nil {
		return true, err
	}
	var nodes []string
	for _, r := range p.Replicas {
		nodes = append(nodes, r.Node)
	}
	recordRepoChange(ctx, data, stderr, "repo restore", name, "in the cluster, from the trash of "+strings.Join(nodes, ", "))
	fmt.Fprintf(stdout, "restored %s in the cluster on %s (primary %s): each node brings its copy back from its trash before it serves it\n",
		name, strings.Join(nodes, ", "), p.Primary)
	return true, nil
}

// setInCluster changes a repository's HEAD branch (if not "") or its
// description (if not nil) on every copy, if the store is a cluster's.
func setInCluster(ctx context.Context, data *datadir.Data, raw, head string, description *string) (bool, error) {
	name, clustered, err := clusterRepo(ctx, data, raw)
	if err != nil || !clustered {
		return clustered, err
	}
	if head != "" {
		if err := repo.CheckBranch(head); err != nil {
			return true, err
		}
		secret, err := data.Store.Setting(ctx, cluster.SettingSecret, "")
		if err != nil {
			return true, err
		}
		branches, err := cluster.PrimaryBranches(ctx, data.Store.DB, secret, name, cluster.DefaultNodeTimeout)
		if err != nil {
			return true, placedOnly(err)
		}
		if len(branches) > 0 && !slices.Contains(branches, head) {
			return true, fmt.Errorf("no branch %q in %s (it has: %s)", head, name, strings.Join(branches, ", "))
		}
	}
	if description != nil {
		if *description, err = repo.CleanDescription(*description); err != nil {
			return true, err
		}
	}
	_, err = cluster.SetSettings(ctx, data.Store.DB, name, cluster.Change{Head: head, Description: description})
	return true, placedOnly(err)
}

// inCluster tells whether the store is a cluster's: PostgreSQL, with nodes.
func inCluster(ctx context.Context, data *datadir.Data) (bool, error) {
	if data.Store.DB.Engine != store.Postgres {
		return false, nil
	}
	var nodes int
	err := data.Store.DB.QueryRowContext(ctx, "SELECT count(*) FROM nodes").Scan(&nodes)
	return nodes > 0, err
}

func cmdClusterVerify(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "cluster verify [REPO...] [--no-repair] [--wait D] [--json] [--database URL]"
	var asJSON, noRepair bool
	var wait, timeout time.Duration
	data, pos, err := openData(ctx, "cluster verify", syn, "Compare each repository's copies with its newest generation: every ref under\nrefs/ read through its node, and their digest against the one recorded with\nthe generation. A copy recorded at the generation whose refs differ is\nrepaired: marked stale, so that its node fetches everything again from a copy\nthat holds the generation's refs (refs that copy lacks deleted); never towards\na copy behind the generation, the primary's included. verify then waits for\nthe repairs and for copies catching up, and checks again. Exits 1 if a copy\nstill differs.\n\n"+clusterNote, args, stderr,
		func(fs *flag.FlagSet) {
			fs.BoolVar(&asJSON, "json", false, "machine-readable output")
			fs.BoolVar(&noRepair, "no-repair", false, "only compare")
			fs.DurationVar(&wait, "wait", 30*time.Second, "how long to wait for repaired replicas to catch up")
			fs.DurationVar(&timeout, "node-timeout", cluster.DefaultNodeTimeout, "as serve's --node-timeout")
		})
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 0, -1, syn); err != nil {
		return err
	}
	secret, err := data.Store.Setting(ctx, cluster.SettingSecret, "")
	if err != nil {
		return err
	}
	if secret == "" {
		return errors.New("no cluster here yet: no node has started on this database")
	}
	checks, err := cluster.Verify(ctx, data.Store.DB, secret, pos, !noRepair, timeout)
	if err != nil {
		return err
	}
	// Repaired copies, and copies still catching up (a copy just added,
	// one behind the generation), are waited for.
	waiting := false
	for _, c := range checks {
		for _, cp := range c.Copies {
			waiting = waiting || cp.Repaired || cp.Generation != c.Generation
		}
	}
	for deadline := time.Now().Add(wait); waiting && !allEqual(checks) && time.Now().Before(deadline); {
		time.Sleep(500 * time.Millisecond)
		again, err := cluster.Verify(ctx, data.Store.DB, secret, pos, false, timeout)
		if err != nil {
			return err
		}
		for i := range again { // keep what was repaired, for the report
			for j := range again[i].Copies {
				again[i].Copies[j].Repaired = checks[i].Copies[j].Repaired
			}
		}
		checks = again
	}
	if asJSON {
		if checks == nil {
			checks = []cluster.RepoCheck{}
		}
		if err := writeJSON(stdout, checks); err != nil {
			return err
		}
	} else {
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "REPOSITORY\tNODE\tROLE\tGENERATION\tREFS\tCHECKSUM\tSTATE")
		for _, c := range checks {
			for _, cp := range c.Copies {
				role, state := "replica", "equal"
				if cp.Node == c.Primary {
					role = "primary"
				}
				switch {
				case cp.Error != "":
					state = "error: " + cp.Error
				case !cp.Equal && cp.Repaired:
					state = "differs; repair did not finish within --wait"
				case !cp.Equal:
					state = "differs"
				case cp.Repaired:
					state = "equal (repaired)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\n", c.Name, cp.Node, role, cp.Generation, cp.Refs, cp.Checksum, state)
			}
		}
		tw.Flush()
	}
	if !allEqual(checks) {
		return errors.New("cluster verify: some copies differ from their generation's refs")
	}
	return nil
}

func allEqual(checks []cluster.RepoCheck) bool {
	for _, c := range checks {
		for _, cp := range c.Copies {
			if !cp.Equal {
				return false
			}
		}
	}
	return true
}
