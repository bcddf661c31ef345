package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"packwire/internal/datadir"
	"packwire/internal/governor"
	"packwire/internal/lfs"
	"packwire/internal/lifecycle"
	"packwire/internal/maintain"
	"packwire/internal/repo"
)

const maintainHelp = `Bring repositories (all, or the ones named) into the layout that serves
clones fastest, doing only the work each one needs:

  - a preferred pack holding exactly the closure of what a default clone
    fetches (branches, tags, HEAD), kept with a .keep, in which the objects
    of HEAD's tree are stored whole or as deltas against each other, never
    against older versions (a delta island), so that a shallow clone or a
    partial clone's checkout gets them as a copy;
  - every other object (refs/pull/*, refs/keep-around/*, other refs) in other
    packs; unreachable objects in a cruft pack for --cruft-expiration;
  - a multi-pack-index with a bitmap that prefers that pack, reverse indexes,
    a commit-graph and packed refs.

A clone then gets the preferred pack streamed verbatim (pack reuse) instead
of objects re-checked and re-written; a full clone of every branch and tag
gets the pack file itself with no git at all (the full run records the tips
it covers), and after pushes that only added, the pack file followed by a
small pack of the pushes (docs/clone-fast-path.md). Pushes land as small packs; a
"geometric" run folds them (git repack --geometric=2) without rewriting the
preferred pack. A "full" run rebuilds the preferred pack when there is none,
or when the drift passes --drift:

  drift = (objects of the preferred pack no default clone wants
           + objects a default clone fetches from outside it)
          / objects a default clone fetches

Measured (bench/maintain/RESULTS.md): full clone server CPU rose 10% with 14%
of the preferred pack unwanted and 52% at 32%; new history folded in
geometrically cost 7-11% at 19-48% on one repository, 12-28% at 12% and
22-46% at 21% on another. A rebuild costs as much CPU as 6-17 full clones, and
at 10% a repository doubling its history rebuilds about 7 times, while a late
rebuild costs every clone: at the default 10% a clone pays 10-30% more at most.

A push killed mid-pack (kill -9, or its client gone) leaves its quarantine,
objects/tmp_objdir-incoming-*, which git removes only when receive-pack
exits normally: maintenance removes one in which nothing was written for an
hour (serve: twice --timeout, at least an hour), whatever else the
repository needs, and says so with its size.

Without REPO, deleted repositories (packwire repo delete) older than
--trash-retention are removed from the trash for good.

git runs at a lower CPU priority (nice 10) and never blocks clones or pushes.
packwire serve does the same in the background (--maintain-interval).
Each run is recorded in the governor; "packwire repo show NAME" shows the layout.`

func cmdMaintain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var full, dryRun bool
	var drift float64
	var expire string
	var trashRetention time.Duration
	data, pos, err := openData(ctx, "maintain", "maintain [--data DIR] [--full] [--dry-run] [REPO...]", maintainHelp, args, stderr, func(fs *flag.FlagSet) {
		fs.BoolVar(&full, "full", false, "rebuild the layout from scratch whatever the checks say")
		fs.BoolVar(&dryRun, "dry-run", false, "only say what each repository needs")
		fs.Float64Var(&drift, "drift", maintain.DefaultDrift, "rebuild the preferred pack when the drift passes this fraction")
		fs.StringVar(&expire, "cruft-expiration", "2.weeks.ago", "keep unreachable objects this long (git date)")
		fs.DurationVar(&trashRetention, "trash-retention", lifecycle.DefaultTrashRetention, "without REPO: remove deleted repositories (packwire repo delete) older than this for good (0: keep them)")
	})
	if err != nil {
		return err
	}
	defer data.Close()
	gov, err := governor.OpenIn(ctx, data.Dir, data.Database)
	if err != nil {
		return err
	}
	defer gov.Close()
	var repos []repo.Repo
	if len(pos) == 0 {
		if repos, err = data.Repos.List(); err != nil {
			return err
		}
	}
	for _, name := range pos {
		r, err := data.Repos.Resolve(name)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		repos = append(repos, r)
	}
	m := maintain.New(maintain.Options{Drift: drift, CruftExpiration: expire, Record: gov.RecordMaintenance,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	var failed error
	if len(pos) == 0 && trashRetention > 0 {
		failed = expireTrash(ctx, data.Dir, data.Repos, trashRetention, dryRun, stdout)
	}
	for _, r := range repos {
		sweepQuarantines(m, r, dryRun, stdout)
		kind, reason := maintain.Full, "requested (--full)"
		if !full {
			if kind, reason, err = m.Plan(ctx, r.Path); err != nil {
				fmt.Fprintf(stdout, "%s: check failed: %v\n", r.Name, err)
				failed = errors.Join(failed, err)
				continue
			}
		}
		if kind == maintain.None {
			fmt.Fprintf(stdout, "%s: in shape\n", r.Name)
			continue
		}
		if dryRun {
			fmt.Fprintf(stdout, "%s: needs %s run: %s\n", r.Name, kind, reason)
			continue
		}
		run, err := m.Run(ctx, r, kind, reason)
		printRun(stdout, run)
		if err != nil {
			failed = errors.Join(failed, fmt.Errorf("%s: %w", r.Name, err))
		}
	}
	return failed
}

// expireTrash removes (with dryRun, lists) the deleted repositories past
// retention, and lets go of their LFS objects (the server's sweep removes
// the content no repository holds any more).
func expireTrash(ctx context.Context, dataDir string, root repo.Root, retention time.Duration, dryRun bool, w io.Writer) error {
	if dryRun {
		list, err := root.ListTrash()
		for _, t := range list {
			if time.Since(t.Deleted) > retention {
				fmt.Fprintf(w, "%s: would remove deleted version %s from the trash\n", t.Name, t.Stamp())
			}
		}
		return err
	}
	removed, err := lifecycle.ExpireTrash(root, retention, time.Now())
	for _, t := range removed {
		fmt.Fprintf(w, "%s: removed deleted version %s from the trash\n", t.Name, t.Stamp())
		if lerr := lfs.Expired(ctx, dataDir, t.Name, t.Stamp()); lerr != nil {
			err = errors.Join(err, fmt.Errorf("%s: LFS objects of deleted version %s: %w", t.Name, t.Stamp(), lerr))
		}
	}
	return err
}

// sweepQuarantines removes (with dryRun, lists) what pushes killed
// mid-pack left in r.
func sweepQuarantines(m *maintain.Maintainer, r repo.Repo, dryRun bool, w io.Writer) {
	qs, verb := []maintain.Quarantine(nil), "removed"
	if dryRun {
		qs, _ = m.StaleQuarantines(r.Path)
		verb = "would remove"
	} else {
		qs = m.RemoveStaleQuarantines(r)
	}
	for _, q := range qs {
		fmt.Fprintf(w, "%s: %s stale push quarantine %s (%s, last written %s ago)\n", r.Name, verb, q.Name,
			bytesText(q.Bytes), time.Since(q.LastWrite).Round(time.Minute))
	}
}

func printRun(w io.Writer, run governor.MaintenanceRun) {
	fmt.Fprintf(w, "%s: %s run (%s): %s in %s, CPU %s; packs %d -> %d, %s -> %s\n", run.Repo, run.Kind, run.Reason, run.Result,
		run.Wall.Round(time.Millisecond), (run.UserCPU + run.SysCPU).Round(time.Millisecond),
		run.PacksBefore, run.PacksAfter, bytesText(run.BytesBefore), bytesText(run.BytesAfter))
	if run.Error != "" {
		fmt.Fprintf(w, "  error: %s\n", run.Error)
	}
}

// maintainImported brings a freshly imported repository into shape at once.
func maintainImported(ctx context.Context, data *datadir.Data, r repo.Repo, stdout io.Writer) error {
	gov, err := governor.OpenIn(ctx, data.Dir, data.Database)
	if err != nil {
		return err
	}
	defer gov.Close()
	m := maintain.New(maintain.Options{Record: gov.RecordMaintenance, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	run, err := m.Run(ctx, r, maintain.Full, "imported")
	printRun(stdout, run)
	return err
}

// cmdRepoShow prints a repository's object layout.
func cmdRepoShow(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	data, pos, err := openData(ctx, "repo show", "repo show NAME [--data DIR]", "Show a repository's object layout: packs, the preferred pack and what it covers,\nthe bitmap, objects outside it, how HEAD's tree is stored (deltas against\nobjects outside it cost shallow and partial clones CPU), and the last\nmaintenance run.", args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 1, 1, "repo show NAME [--data DIR]"); err != nil {
		return err
	}
	r, err := data.Repos.Resolve(pos[0])
	if err != nil {
		return fmt.Errorf("repo show %s: %w", pos[0], err)
	}
	l, err := maintain.Inspect(r.Path)
	if err != nil {
		return err
	}
	m := maintain.New(maintain.Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	refs, err := m.ReadRefs(ctx, r.Path)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s at %s\n", r.Name, r.Path)
	if head := repo.Head(r); head != "" {
		fmt.Fprintf(stdout, "HEAD: refs/heads/%s\n", head)
	}
	if d := repo.Description(r); d != "" {
		fmt.Fprintf(stdout, "description: %s\n", d)
	}
	if err := printUsage(stdout, r); err != nil {
		return err
	}
	lfsObjects, lfsBytes, err := lfsUsage(ctx, data, r.Name)
	if err != nil {
		return fmt.Errorf("repo show %s: LFS: %w", r.Name, err)
	}
	fmt.Fprintf(stdout, "LFS objects: %d, %s\n", lfsObjects, bytesText(lfsBytes))
	fmt.Fprintf(stdout, "refs: %d branches, %d tags, %d other\n", refs.Branches, refs.Tags, refs.Other)
	fmt.Fprintf(stdout, "packs: %d, %s; loose objects: %d\n", len(l.Packs), bytesText(l.Bytes()), l.Loose)
	for _, p := range l.Packs {
		var what string
		switch {
		case p.Preferred:
			what = "preferred"
		case p.Cruft:
			what = "cruft (unreachable, kept for the grace period)"
		case p.Keep:
			what = "kept (" + keepNote(p.KeepNote) + ")"
		}
		inMIDX := ""
		if p.Bitmap {
			inMIDX += " (pack bitmap)"
		}
		if l.MIDX && !l.MIDXPacks[p.Name] {
			inMIDX += " not in the multi-pack-index"
		}
		fmt.Fprintf(stdout, "  %s %10s %8d objects  %s%s\n", p.Name, bytesText(p.Size), p.Objects, what, inMIDX)
	}
	fmt.Fprintf(stdout, "multi-pack-index: %v, multi-pack bitmap: %v, commit-graph: %v\n", l.MIDX, l.Bitmap, l.CommitGraph)
	if pref := l.PreferredPack(); pref != nil {
		st := l.State
		fmt.Fprintf(stdout, "preferred pack: closure of %d branches + %d tags (and HEAD) as of %s, %d objects\n",
			st.Branches, st.Tags, st.Built.Format(time.RFC3339), pref.Objects)
		var outside int64
		for _, p := range l.Packs {
			if !p.Preferred {
				outside += p.Objects
			}
		}
		fmt.Fprintf(stdout, "objects outside it: %d (other refs, pushes since, unreachable)\n", outside)
		if d, err := m.ReadDrift(ctx, r.Path); err == nil {
			fmt.Fprintf(stdout, "default clone now: %d objects, %d outside the preferred pack, %d of it unwanted: drift %.1f%% (full rebuild above %.1f%%)\n",
				d.Closure, d.New, d.Stale, 100*d.Ratio(), 100*m.Drift)
		}
	} else {
		fmt.Fprintln(stdout, "preferred pack: none (packwire maintain brings the repository into shape)")
	}
	if c, err := m.ReadCheckout(ctx, r.Path); err == nil && c.Objects > 0 {
		fmt.Fprintf(stdout, "checkout (HEAD's tree): %d objects, %d stored as deltas, %d against bases outside the tree (shallow and partial clones make git rebuild those)\n",
			c.Objects, c.Deltas, c.Outside)
	}
	gov, err := governor.OpenIn(ctx, data.Dir, data.Database)
	if err != nil {
		return err
	}
	defer gov.Close()
	runs, err := gov.LastMaintenance(ctx, r.Name, 1)
	if err != nil {
		return err
	}
	if len(runs) == 0 {
		fmt.Fprintln(stdout, "last maintenance: never")
	} else {
		run := runs[0]
		fmt.Fprintf(stdout, "last maintenance: %s, %s run (%s): %s in %s, CPU %s, packs %d -> %d\n", run.Start.UTC().Format(time.RFC3339),
			run.Kind, run.Reason, run.Result, run.Wall.Round(time.Millisecond), (run.UserCPU + run.SysCPU).Round(time.Millisecond),
			run.PacksBefore, run.PacksAfter)
	}
	return nil
}

func keepNote(s string) string {
	for i, c := range s {
		if c == '\n' {
			return s[:i]
		}
	}
	return s
}

// lfsUsage is how many LFS objects a repository holds and their bytes: in
// the index of the data directory, or a cluster's shared one.
func lfsUsage(ctx context.Context, data *datadir.Data, name string) (objects, bytes int64, err error) {
	clustered, err := inCluster(ctx, data)
	if err != nil || !clustered {
		if err != nil {
			return 0, 0, err
		}
		return lfs.RepoUsage(ctx, data.Dir, name)
	}
	x, err := lfs.OpenIndexPostgres(ctx, data.Database)
	if err != nil {
		return 0, 0, err
	}
	defer x.Close()
	return x.Usage(ctx, name)
}
