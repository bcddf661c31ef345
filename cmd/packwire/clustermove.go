package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"packwire/internal/datadir"
	"packwire/internal/server/cluster"
)

const moveNote = `A copy leaves a healthy node only once the new copy has been made and has
caught up (pushes go on meanwhile); a node that is down (lost, being
replaced) has its copy dropped and the new one placed in one step, so that
pushes go on with the copies left. Either way a copy goes only while another
copy holds every acknowledged push, and a primary's copy hands the primary
to such a copy first. The old copy is no longer served; its node moves its
files into its trash (kept for --trash-retention) when it next runs.`

func cmdClusterMove(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "cluster move REPO FROM TO [--wait D] [--node-timeout D] [--database URL]"
	var wait, timeout time.Duration
	data, pos, err := openData(ctx, "cluster move", syn, "Move REPO's copy from node FROM to node TO.\n\n"+moveNote+"\n\n"+clusterNote, args, stderr,
		func(fs *flag.FlagSet) {
			fs.DurationVar(&wait, "wait", 10*time.Minute, "how long to wait for the new copy to catch up (from a healthy node)")
			fs.DurationVar(&timeout, "node-timeout", cluster.DefaultNodeTimeout, "as serve's --node-timeout")
		})
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 3, 3, syn); err != nil {
		return err
	}
	name, err := clusterRepoName(ctx, data, pos[0])
	if err != nil {
		return err
	}
	return placedOnly(moveCopy(ctx, data, name, pos[1], pos[2], wait, timeout, stdout))
}

func cmdClusterEvacuate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "cluster evacuate NODE [--wait D] [--node-timeout D] [--database URL]"
	var wait, timeout time.Duration
	data, pos, err := openData(ctx, "cluster evacuate", syn, "Move every copy NODE holds to other healthy nodes (the ones with the fewest\ncopies first), one repository at a time; a node that is down and then\nholds nothing leaves the cluster's nodes (it joins again if it comes back).\nUse it to replace a lost node, or to empty one before taking it away.\n\n"+moveNote+"\n\n"+clusterNote, args, stderr,
		func(fs *flag.FlagSet) {
			fs.DurationVar(&wait, "wait", 10*time.Minute, "how long to wait for each new copy to catch up (from a healthy node)")
			fs.DurationVar(&timeout, "node-timeout", cluster.DefaultNodeTimeout, "as serve's --node-timeout")
		})
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 1, 1, syn); err != nil {
		return err
	}
	if ok, err := inCluster(ctx, data); err != nil || !ok {
		return notClustered(err)
	}
	node := pos[0]
	db := data.Store.DB
	if _, err := cluster.Healthy(ctx, db, node, timeout); err != nil {
		return err
	}
	repos, err := cluster.CopiesOn(ctx, db, node)
	if err != nil {
		return err
	}
	var failed []error
	for _, name := range repos {
		to, err := cluster.MoveTarget(ctx, db, name, timeout)
		if err == nil && to == "" {
			err = fmt.Errorf("%w: no healthy node without a copy of %s", cluster.ErrMoveRefused, name)
		}
		if err == nil {
			err = moveCopy(ctx, data, name, node, to, wait, timeout, stdout)
		}
		if err != nil {
			fmt.Fprintf(stdout, "%s: %v\n", name, err)
			failed = append(failed, err)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d copies on %s not moved", len(failed), len(repos), node)
	}
	if forgot, err := cluster.Forget(ctx, db, node, timeout); err != nil {
		return err
	} else if forgot {
		fmt.Fprintf(stdout, "node %s holds nothing and is down: removed from the cluster's nodes\n", node)
	}
	fmt.Fprintf(stdout, "%s holds no copies\n", node)
	return nil
}

// moveCopy moves name's copy from one node to another (see moveNote) and
// says what it did.
func moveCopy(ctx context.Context, data *datadir.Data, name, from, to string, wait, timeout time.Duration, stdout io.Writer) error {
	db := data.Store.DB
	if from == to {
		return fmt.Errorf("%w: FROM and TO are the same node", cluster.ErrMoveRefused)
	}
	fromUp, err := cluster.Healthy(ctx, db, from, timeout)
	if err != nil {
		return err
	}
	if !fromUp {
		// Refused as a whole unless TO can take a copy.
		if up, err := cluster.Healthy(ctx, db, to, timeout); err != nil {
			return err
		} else if !up {
			return fmt.Errorf("%w: node %s is not healthy (packwire cluster status)", cluster.ErrMoveRefused, to)
		}
		if err := cluster.DropCopy(ctx, db, name, from, to, timeout); err != nil {
			return err
		}
		data.Store.RecordAudit(ctx, "cluster.move", name, fmt.Sprintf("from %s (down) to %s", from, to))
		fmt.Fprintf(stdout, "%s: copy on %s (down) dropped; %s makes a new one and catches it up\n", name, from, to)
		return nil
	}
	if _, err := cluster.AddCopy(ctx, db, name, to, timeout); err != nil {
		return err
	}
	// Pushes go on meanwhile: a push may land between the new copy's
	// catching up and the drop, which then waits for it again.
	deadline := time.Now().Add(wait)
	for {
		current, err := cluster.AwaitCopy(ctx, db, name, to, time.Until(deadline))
		if err != nil {
			return err
		}
		if current {
			err = cluster.ReplaceCopy(ctx, db, name, from, to, timeout)
			if err == nil {
				break
			}
			if !errors.Is(err, cluster.ErrCopyBehind) {
				return err
			}
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("%s's new copy on %s has not caught up within %s; the copy on %s stays (run the move again to finish it)", name, to, wait, from)
		}
	}
	data.Store.RecordAudit(ctx, "cluster.move", name, fmt.Sprintf("from %s to %s", from, to))
	fmt.Fprintf(stdout, "%s: moved from %s to %s\n", name, from, to)
	return nil
}

// clusterRepoName checks that raw names a repository of the cluster and
// returns its name.
func clusterRepoName(ctx context.Context, data *datadir.Data, raw string) (string, error) {
	name, clustered, err := clusterRepo(ctx, data, raw)
	if err != nil {
		return "", err
	}
	if !clustered {
		return "", notClustered(nil)
	}
	return name, nil
}

func notClustered(err error) error {
	if err != nil {
		return err
	}
	return errors.New("no cluster here: cluster move and evacuate need a cluster's --database (packwire cluster status)")
}
