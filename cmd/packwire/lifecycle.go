package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"packwire/internal/lfs"
	"packwire/internal/lifecycle"
	"packwire/internal/repo"
	"packwire/internal/server/cluster"
)

const trashNote = `Deleted repositories wait in DATA/repos/.trash/NAME.TIMESTAMP.git, out of
clients' reach, for the server's --trash-retention (default 7 days); its
maintenance scheduler (or packwire maintain --trash-retention) then removes
them for good. In a cluster (--database with nodes) each node keeps its copy
in its own trash; repo trash lists the cluster's deletions (and the nodes
holding a copy) and repo restore brings every copy back at once.`

// cmdRepoDelete moves a repository into the trash.
func cmdRepoDelete(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "repo delete NAME [--data DIR]"
	data, pos, err := openData(ctx, "repo delete", syn,
		"Delete a repository: it is moved (one rename) into the trash, and clients get\n\"repository 'NAME' not found\" from then on; packwire repo restore brings it\nback. Refused while a push, maintenance or backup works in the repository.\nIn a cluster (--database with nodes) it is deleted from every node at once;\neach node moves its copy into its own trash.\n\n"+trashNote, args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 1, 1, syn); err != nil {
		return err
	}
	if deleted, err := deleteInCluster(ctx, data, pos[0], stdout, stderr); deleted || err != nil {
		if err != nil {
			return fmt.Errorf("repo delete %s: %w", pos[0], err)
		}
		return nil
	}
	t, err := lifecycle.Delete(data.Repos, pos[0], time.Now())
	if err != nil {
		return fmt.Errorf("repo delete %s: %w", pos[0], err)
	}
	recordRepoChange(ctx, data, stderr, "repo delete", t.Name, "in the trash as "+t.Stamp())
	if err := lfs.Deleted(ctx, data.Dir, t.Name, t.Stamp()); err != nil {
		return fmt.Errorf("repo delete %s: deleted, but its LFS objects are still recorded under its name: %w", t.Name, err)
	}
	fmt.Fprintf(stdout, "deleted %s: in the trash as %s (packwire repo restore %s --at %s)\n", t.Name, t.Stamp(), t.Name, t.Stamp())
	return nil
}

// cmdRepoRestore moves a deleted repository back.
func cmdRepoRestore(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "repo restore NAME [--at TIMESTAMP] [--data DIR]"
	var at string
	data, pos, err := openData(ctx, "repo restore", syn,
		"Bring a deleted repository back under its name, as it was when deleted.\nRefused if a repository of that name exists again (rename one of them).\n\n"+trashNote, args, stderr,
		func(fs *flag.FlagSet) {
			fs.StringVar(&at, "at", "", "the deleted version to restore, by its time as packwire repo trash lists it (e.g. 20260301T120000Z; default: the last deleted)")
		})
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 1, 1, syn); err != nil {
		return err
	}
	if restored, err := restoreInCluster(ctx, data, pos[0], at, stdout, stderr); restored || err != nil {
		if err != nil {
			return fmt.Errorf("repo restore %s: %w", pos[0], err)
		}
		return nil
	}
	r, t, err := lifecycle.Restore(data.Repos, pos[0], at)
	if err != nil {
		return fmt.Errorf("repo restore %s: %w", pos[0], err)
	}
	recordRepoChange(ctx, data, stderr, "repo restore", r.Name, "deleted "+t.Stamp())
	if err := lfs.Restored(ctx, data.Dir, r.Name, t.Stamp()); err != nil {
		return fmt.Errorf("repo restore %s: restored, but not its LFS objects: %w", r.Name, err)
	}
	fmt.Fprintf(stdout, "restored %s (deleted %s)\n", r.Name, t.Stamp())
	return nil
}

// cmdRepoTrash lists deleted repositories.
func cmdRepoTrash(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	data, pos, err := openData(ctx, "repo trash", "repo trash [--data DIR]",
		"List deleted repositories: name, deletion time (what repo restore --at takes),\nsize of their objects.\n\n"+trashNote, args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 0, 0, "repo trash [--data DIR]"); err != nil {
		return err
	}
	if clustered, err := inCluster(ctx, data); err != nil || clustered {
		if err != nil {
			return err
		}
		list, err := cluster.Trash(ctx, data.Store.DB)
		if err != nil {
			return err
		}
		for _, t := range list {
			fmt.Fprintf(stdout, "%s\t%s\ton %s\n", t.Name, t.Stamp(), strings.Join(t.Nodes, ", "))
		}
		return nil
	}
	list, err := data.Repos.ListTrash()
	if err != nil {
		return err
	}
	for _, t := range list {
		size, _ := repo.Usage(repo.Repo{Name: t.Name, Path: t.Path})
		fmt.Fprintf(stdout, "%s\t%s\t%s\n", t.Name, t.Stamp(), bytesText(size))
	}
	return nil
}

// cmdRepoRename renames a repository and says which access patterns no
// longer reach it.
func cmdRepoRename(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "repo rename OLD NEW [--data DIR]"
	data, pos, err := openData(ctx, "repo rename", syn,
		`Rename a repository: one rename within DATA/repos (NEW's parent directories
are created); clients find it under NEW at once and no longer under OLD.
Refused if NEW exists or is inside another repository, and while a push,
maintenance or backup works in the repository. Grants, ref rules and
anonymous-read settings are patterns and stay as they are: the command lists
those that matched OLD and do not match NEW (and the reverse), to fix with
packwire grant, rule and anonymous-read. In a cluster (--database with nodes)
it is renamed on every node at once: clients find it under NEW on any node,
and each node moves its copy before it serves NEW.`, args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 2, 2, syn); err != nil {
		return err
	}
	from, to, renamed, err := renameInCluster(ctx, data, pos[0], pos[1], stdout, stderr)
	if err != nil {
		return fmt.Errorf("repo rename %s %s: %w", pos[0], pos[1], err)
	}
	if !renamed {
		f, t, err := lifecycle.Rename(data.Repos, pos[0], pos[1])
		if err != nil {
			return fmt.Errorf("repo rename %s %s: %w", pos[0], pos[1], err)
		}
		from, to = f.Name, t.Name
		recordRepoChange(ctx, data, stderr, "repo rename", from, "to "+to)
		if err := lfs.Renamed(ctx, data.Dir, from, to); err != nil {
			return fmt.Errorf("repo rename %s %s: renamed, but its LFS objects are still recorded under %s: %w", from, to, from, err)
		}
		fmt.Fprintf(stdout, "renamed %s to %s\n", from, to)
	}
	changes, err := lifecycle.AccessChanges(ctx, data.Store, from, to)
	if err != nil {
		return fmt.Errorf("renamed, but reading the access model failed: %w", err)
	}
	if len(changes) == 0 {
		fmt.Fprintf(stdout, "every grant, rule and anonymous-read setting applies to %s as it did to %s\n", to, from)
		return nil
	}
	for _, lost := range []bool{true, false} {
		header := fmt.Sprintf("matched %s, do not match %s:", from, to)
		if !lost {
			header = fmt.Sprintf("match %s, did not match %s:", to, from)
		}
		var lines []string
		for _, c := range changes {
			if c.Lost == lost {
				lines = append(lines, fmt.Sprintf("  %s %s", c.What, c.Text))
			}
		}
		if len(lines) > 0 {
			fmt.Fprintf(stdout, "%s\n%s\n", header, strings.Join(lines, "\n"))
		}
	}
	return nil
}

// cmdRepoSetDescription sets git's description file.
func cmdRepoSetDescription(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "repo set-description NAME TEXT [--data DIR]"
	data, pos, err := openData(ctx, "repo set-description", syn,
		"Set the repository's description: one line in git's description file, which\ngitweb, cgit and packwire repo list and repo show display (\"\" clears it).\nIn a cluster (--database with nodes) every copy's changes.", args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 2, 2, syn); err != nil {
		return err
	}
	text := pos[1]
	if set, err := setInCluster(ctx, data, pos[0], "", &text); set || err != nil {
		if err != nil {
			return fmt.Errorf("repo set-description %s: %w", pos[0], err)
		}
		recordRepoChange(ctx, data, stderr, "repo set-description", pos[0], text+" (every copy)")
		fmt.Fprintf(stdout, "%s: description set on every copy (each node writes it within a heartbeat)\n", pos[0])
		return nil
	}
	r, err := data.Repos.Resolve(pos[0])
	if err != nil {
		return fmt.Errorf("repo set-description %s: %w", pos[0], err)
	}
	if err := repo.SetDescription(r, pos[1]); err != nil {
		return fmt.Errorf("repo set-description %s: %w", r.Name, err)
	}
	recordRepoChange(ctx, data, stderr, "repo set-description", r.Name, pos[1])
	fmt.Fprintf(stdout, "%s: description set\n", r.Name)
	return nil
}

// printRepoList prints names, with descriptions where set.
func printRepoList(w io.Writer, repos []repo.Repo) {
	width := 0
	descs := make([]string, len(repos))
	for i, r := range repos {
		if descs[i] = repo.Description(r); descs[i] != "" {
			width = max(width, len(r.Name))
		}
	}
	for i, r := range repos {
		if descs[i] == "" {
			fmt.Fprintln(w, r.Name)
			continue
		}
		fmt.Fprintf(w, "%-*s  %s\n", width, r.Name, descs[i])
	}
}
