package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"packwire/internal/datadir"
	"packwire/internal/mirror"
	"packwire/internal/server/cluster"
	"packwire/internal/server/cluster/route"
	"packwire/internal/store"
)

// Mirrors in a cluster: the mirroring (with credentials) is one of the
// repository's settings, which every node applies to its copy; the
// repository's primary syncs and pushes (route.MirrorPath).

// clusterMirrorSpec reads a cluster repository's mirroring.
func clusterMirrorSpec(ctx context.Context, data *datadir.Data, name string) (mirror.Spec, error) {
	st, err := cluster.RepoSettings(ctx, data.Store.DB, name)
	if err != nil {
		return mirror.Spec{}, placedOnly(err)
	}
	if st.Mirror == nil {
		return mirror.Spec{}, nil
	}
	return mirror.ParseSpec(*st.Mirror)
}

// setClusterMirrorSpec sets a cluster repository's mirroring, then waits
// (a few heartbeats at most) for its primary to apply it, so that the next
// push already goes to a push mirror just added. It says whether it did.
func setClusterMirrorSpec(ctx context.Context, data *datadir.Data, name string, spec mirror.Spec) (bool, error) {
	text := spec.Encode()
	st, err := cluster.SetSettings(ctx, data.Store.DB, name, cluster.Change{Mirror: &text})
	if err != nil {
		return false, placedOnly(err)
	}
	return waitPrimaryApplied(ctx, data, name, st.Number)
}

// waitPrimaryApplied waits, a few heartbeats at most, for the primary of
// a cluster repository to apply its settings number n (pushes go to the
// primary, so the next one already sees them). It says whether it did.
func waitPrimaryApplied(ctx context.Context, data *datadir.Data, name string, n int64) (bool, error) {
	deadline := time.Now().Add(5 * cluster.DefaultHeartbeat)
	for {
		applied, err := cluster.PrimaryApplied(ctx, data.Store.DB, name, n)
		if err != nil || applied || time.Now().After(deadline) {
			return applied, err
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// appliedText says when the nodes have or will have a change.
func appliedText(applied bool) string {
	if applied {
		return "its primary applied it; every node does within a heartbeat"
	}
	return "not applied by its primary yet (is its node up? packwire cluster status); every node applies it when it next reconciles"
}

// askPrimary calls route.MirrorPath on the repository's primary.
func askPrimary(ctx context.Context, data *datadir.Data, call route.MirrorCall) (route.MirrorAnswer, error) {
	secret, err := data.Store.Setting(ctx, cluster.SettingSecret, "")
	if err != nil {
		return route.MirrorAnswer{}, err
	}
	a, err := route.AskPrimary(ctx, data.Store.DB, secret, cluster.DefaultNodeTimeout, call)
	if err != nil {
		return a, placedOnly(err)
	}
	if a.Error != "" {
		return a, errors.New(a.Error)
	}
	return a, nil
}

// syncInCluster has the repository's primary sync its pull mirror.
func syncInCluster(ctx context.Context, data *datadir.Data, name string) (mirror.SyncResult, error) {
	spec, err := clusterMirrorSpec(ctx, data, name)
	if err != nil {
		return mirror.SyncResult{}, err
	}
	if spec.Pull == nil {
		return mirror.SyncResult{}, fmt.Errorf("%s: %w", name, mirror.ErrNotMirror)
	}
	a, err := askPrimary(ctx, data, route.MirrorCall{Action: "sync", Repo: name})
	if err != nil || a.Sync == nil {
		return mirror.SyncResult{}, err
	}
	return *a.Sync, nil
}

// addPushInCluster adds a push mirror to a cluster repository.
func addPushInCluster(ctx context.Context, data *datadir.Data, name, rawURL, token string, stdout io.Writer) (mirror.PushMirror, error) {
	spec, err := clusterMirrorSpec(ctx, data, name)
	if err != nil {
		return mirror.PushMirror{}, err
	}
	spec, pm, err := spec.WithPush(rawURL, token)
	if err != nil {
		return pm, err
	}
	applied, err := setClusterMirrorSpec(ctx, data, name, spec)
	if err != nil {
		return pm, err
	}
	stored := ""
	if p := spec.Pushes[len(spec.Pushes)-1]; !p.Credentials.Empty() {
		stored = " (credentials stored)"
	}
	fmt.Fprintf(stdout, "push mirror %d of %s added: %s%s; %s\n", pm.ID, name, mirror.Redact(pm.URL), stored, appliedText(applied))
	return pm, nil
}

// removePushInCluster removes a push mirror of a cluster repository.
func removePushInCluster(ctx context.Context, data *datadir.Data, name string, id int) (mirror.PushMirror, error) {
	spec, err := clusterMirrorSpec(ctx, data, name)
	if err != nil {
		return mirror.PushMirror{}, err
	}
	spec, pm, err := spec.WithoutPush(name, id)
	if err != nil {
		return pm, err
	}
	_, err = setClusterMirrorSpec(ctx, data, name, spec)
	return pm, err
}

// listClusterMirrors is repo mirror list for a cluster repository: the
// settings from the store, the last sync from its primary.
func listClusterMirrors(ctx context.Context, data *datadir.Data, name string, stdout io.Writer) error {
	spec, err := clusterMirrorSpec(ctx, data, name)
	if err != nil {
		return err
	}
	creds := map[string]bool{}
	if spec.Pull != nil {
		creds[mirror.PullRemote] = !spec.Pull.Credentials.Empty()
	}
	cfg := spec.Config()
	for i, p := range spec.Pushes {
		creds[cfg.Pushes[i].Remote] = !p.Credentials.Empty()
	}
	state := func() (mirror.State, error) {
		a, err := askPrimary(ctx, data, route.MirrorCall{Action: "state", Repo: name})
		if err != nil || a.State == nil {
			return mirror.State{}, err
		}
		return *a.State, nil
	}
	return printMirrors(ctx, data, name, cfg, func(remote string) bool { return creds[remote] }, state, stdout)
}

// abandonPushDeliveries gives up a removed push mirror's pending deliveries.
func abandonPushDeliveries(ctx context.Context, data *datadir.Data, name string, id int) error {
	return data.Store.AbandonDeliveries(ctx, store.KindPushMirror, mirror.PushTarget(name, id), "push mirror removed")
}
