package main

import (
	"context"
	"fmt"
	"io"

	"packwire/internal/datadir"
	"packwire/internal/server/cluster"

	"packwire/internal/repo"
	"packwire/internal/units"
)

// cmdDefaultBranch shows or sets the branch new repositories' HEAD names.
func cmdDefaultBranch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "default-branch [BRANCH] [--data DIR]"
	data, pos, err := openData(ctx, "default-branch", syn,
		"Show, or set, the branch that HEAD names in repositories created from now on\n(default "+repo.DefaultBranch+"; repo create --default-branch overrides it for one).\nWhen the first push into a repository leaves HEAD naming a missing\nbranch, HEAD follows the pushed branch: "+repo.DefaultBranch+" if pushed, else the only\none, else the first.", args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 0, 1, syn); err != nil {
		return err
	}
	switch len(pos) {
	case 0:
		b, err := data.Store.Setting(ctx, repo.SettingDefaultBranch, repo.DefaultBranch)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, b)
		return nil
	case 1:
		if err := repo.CheckBranch(pos[0]); err != nil {
			return fmt.Errorf("default-branch: %w", err)
		}
		if err := data.Store.SetSetting(ctx, repo.SettingDefaultBranch, pos[0]); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "new repositories' HEAD names %s\n", pos[0])
	}
	return nil
}

// cmdRepoSetHead points a repository's HEAD (its default branch) at a branch.
func cmdRepoSetHead(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "repo set-head NAME BRANCH [--data DIR]"
	data, pos, err := openData(ctx, "repo set-head", syn,
		"Make BRANCH the repository's default branch: the one HEAD names, which\nclones check out. The branch must exist unless the repository has none yet.\nIn a cluster (--database with nodes) every copy's HEAD changes.", args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 2, 2, syn); err != nil {
		return err
	}
	if set, err := setInCluster(ctx, data, pos[0], pos[1], nil); set || err != nil {
		if err != nil {
			return fmt.Errorf("repo set-head %s: %w", pos[0], err)
		}
		recordRepoChange(ctx, data, stderr, "repo set-head", pos[0], "refs/heads/"+pos[1]+" on every copy")
		fmt.Fprintf(stdout, "%s: HEAD -> refs/heads/%s on every copy (each node sets it within a heartbeat)\n", pos[0], pos[1])
		return nil
	}
	r, err := data.Repos.Resolve(pos[0])
	if err != nil {
		return fmt.Errorf("repo set-head %s: %w", pos[0], err)
	}
	if err := repo.SetHead(ctx, r, pos[1]); err != nil {
		return fmt.Errorf("repo set-head %s: %w", r.Name, err)
	}
	recordRepoChange(ctx, data, stderr, "repo set-head", r.Name, "refs/heads/"+pos[1])
	fmt.Fprintf(stdout, "%s: HEAD -> refs/heads/%s\n", r.Name, pos[1])
	return nil
}

// cmdRepoQuota shows or sets a repository's size quota.
func cmdRepoQuota(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "repo quota NAME [SIZE|off] [--data DIR]"
	data, pos, err := openData(ctx, "repo quota", syn,
		"Show a repository's size on disk and quota, or set the quota (500M, 2G, a byte\ncount; off removes it). A push that brings objects into a repository at or\nover its quota is refused ref by ref (\"repository over its quota\"), and one\nwhose pack would exceed the room left gets git's \"pack exceeds maximum\nallowed size\". Deletes are never refused for the quota. The quota is kept in\nthe repository's own config (packwire.quota): it moves with the repository.", args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 1, 2, syn); err != nil {
		return err
	}
	if done, err := quotaInCluster(ctx, data, pos, stdout, stderr); done || err != nil {
		return err
	}
	r, err := data.Repos.Resolve(pos[0])
	if err != nil {
		return fmt.Errorf("repo quota %s: %w", pos[0], err)
	}
	if len(pos) == 2 {
		bytes, err := parseQuota(r.Name, pos[1])
		if err != nil {
			return err
		}
		if err := repo.SetQuota(ctx, r, bytes); err != nil {
			return fmt.Errorf("repo quota %s: %w", r.Name, err)
		}
		recordRepoChange(ctx, data, stderr, "repo quota", r.Name, pos[1])
	}
	return printUsage(stdout, r)
}

// quotaInCluster shows or sets a cluster repository's quota, kept with
// its settings (cluster.Settings) and applied by each node to its copy.
// The size on disk is each node's: the Cluster page and repo quota on a
// node's own data directory show it.
func quotaInCluster(ctx context.Context, data *datadir.Data, pos []string, stdout, stderr io.Writer) (bool, error) {
	name, clustered, err := clusterRepo(ctx, data, pos[0])
	if err != nil || !clustered {
		if err != nil {
			err = fmt.Errorf("repo quota %s: %w", pos[0], err)
		}
		return clustered, err
	}
	var st cluster.Settings
	if len(pos) == 2 {
		bytes, err := parseQuota(name, pos[1])
		if err != nil {
			return true, err
		}
		st, err = cluster.SetSettings(ctx, data.Store.DB, name, cluster.Change{Quota: &bytes})
		if err != nil {
			return true, fmt.Errorf("repo quota %s: %w", name, placedOnly(err))
		}
		recordRepoChange(ctx, data, stderr, "repo quota", name, pos[1]+" (every copy)")
		// The primary checks a push against the quota: once it has the
		// change, the next push sees it (a push right after "off" was
		// refused over the old quota).
		applied, err := waitPrimaryApplied(ctx, data, name, st.Number)
		if err != nil {
			return true, fmt.Errorf("repo quota %s: %w", name, err)
		}
		printClusterQuota(stdout, name, st, "; "+appliedText(applied))
		return true, nil
	}
	if st, err = cluster.RepoSettings(ctx, data.Store.DB, name); err != nil {
		return true, fmt.Errorf("repo quota %s: %w", name, placedOnly(err))
	}
	printClusterQuota(stdout, name, st, "")
	return true, nil
}

// printClusterQuota says what quota a cluster repository's copies have,
// and then note.
func printClusterQuota(w io.Writer, name string, st cluster.Settings, note string) {
	if st.Quota == nil || *st.Quota == 0 {
		fmt.Fprintf(w, "%s: no quota on its copies%s\n", name, note)
	} else {
		fmt.Fprintf(w, "%s: a %s quota on every copy%s\n", name, units.Bytes(*st.Quota), note)
	}
}

// parseQuota reads repo quota's SIZE: a size, or off (0).
func parseQuota(name, arg string) (int64, error) {
	if arg == "off" {
		return 0, nil
	}
	bytes, err := units.ParseBytes(arg)
	if err != nil || bytes == 0 {
		return 0, usagef("repo quota %s: %q is not a size (500M, 2G, a byte count, or off)", name, arg)
	}
	return bytes, nil
}

// printUsage prints a repository's size on disk and its quota.
func printUsage(w io.Writer, r repo.Repo) error {
	used, err := repo.Usage(r)
	if err != nil {
		return err
	}
	quota, err := repo.Quota(r)
	if err != nil {
		return err
	}
	if quota > 0 {
		fmt.Fprintf(w, "%s: %s on disk of a %s quota (%.0f%%)\n", r.Name, units.Bytes(used), units.Bytes(quota), 100*float64(used)/float64(quota))
	} else {
		fmt.Fprintf(w, "%s: %s on disk, no quota\n", r.Name, units.Bytes(used))
	}
	return nil
}
