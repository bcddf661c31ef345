package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"packwire/internal/backup"
	"packwire/internal/buildinfo"
	"packwire/internal/datadir"
)

const backupHelp = `Write a consistent snapshot of a data directory into OUT (a new or empty
directory), safe while the server runs and pushes land. It covers a data
directory with its SQLite store; a store kept in PostgreSQL (--database) is
backed up with pg_dump or the provider's backups instead.

  - packwire.db (users, keys, token hashes, grants, rules, settings) by
    SQLite's VACUUM INTO; governor.db (request records) only with --governor;
  - the SSH host keys, so that clients' pinned fingerprints stay valid;
  - Git LFS: lfs/lfs.db (which repository holds which object, locks) by
    VACUUM INTO, then the objects it names; objects in an S3 store
    (--lfs-store) are not copied: the store is checked to hold every one
    and recorded in the manifest (back the bucket up by its own means). A
    backup whose index names an object it cannot bring back fails;
  - every repository: its refs read first (written as the copy's
    packed-refs), then its objects, so every object those refs reach is in
    the copy; each one under a lock that keeps maintenance, repo delete and
    repo rename out while it is copied (a maintenance run is waited for);
  - manifest.json: packwire version, time, repositories with their HEAD and
    ref counts.

Object files are hard-linked where OUT is on the same file system (git never
rewrites them in place), copied otherwise or with --copy. Not included:
deleted repositories (the trash), caches, the lab's reports, reflogs and
repository hooks (packwire runs its own). "packwire restore OUT --data
NEWDIR" rebuilds a server from the backup.`

func cmdBackup(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var opts backup.Options
	fs := newFlagSet("backup", "backup [--data DIR] [--governor] [--copy] [--verify] [--lfs-store URL] OUT", backupHelp, stderr)
	dir := dataFlag(fs)
	fs.BoolVar(&opts.Governor, "governor", false, "include the request records (governor.db; can be large)")
	fs.BoolVar(&opts.Copy, "copy", false, "copy object files even where a hard link would do (a backup that shares no inode with the data)")
	fs.BoolVar(&opts.Verify, "verify", false, "check each repository copy: every object its refs reach is there (git fsck --connectivity-only)")
	fs.StringVar(&opts.LFSStore, "lfs-store", "", "the S3 store serve's --lfs-store names, if LFS objects are kept there: checked to hold every\nobject the index names and recorded, not copied")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	// A missing data directory is said as every admin command says it.
	data, err := datadir.Open(ctx, *dir)
	if err != nil {
		return err
	}
	data.Close()
	if err := wantArgs(args, pos, 1, 1, "backup [--data DIR] [--governor] [--copy] [--verify] [--lfs-store URL] OUT"); err != nil {
		return err
	}
	opts.Version = buildinfo.Get().Version
	opts.Log = func(format string, args ...any) { fmt.Fprintf(stdout, format+"\n", args...) }
	start := time.Now()
	m, stats, err := backup.Create(ctx, *dir, pos[0], opts)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	fmt.Fprintf(stdout, "backed up %d repositories and %d files into %s in %s (%s copied, %s hard-linked)\n",
		len(m.Repositories), len(m.Files), pos[0], time.Since(start).Round(time.Millisecond), bytesText(stats.Copied), bytesText(stats.Linked))
	return nil
}

func cmdRestore(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var opts backup.Options
	fs := newFlagSet("restore", "restore BACKUP --data NEWDIR [--copy] [--lfs-store URL]", `Rebuild a data directory from a backup written by packwire backup. NEWDIR
must not exist or be empty (it is written beside and renamed into place, so
a failed restore leaves nothing). Then "packwire serve --data NEWDIR" serves
the repositories, users, keys, tokens and access rules of the backup, with
the same SSH host keys. Object files are hard-linked from the backup where
they can be (--copy: never); everything else is copied. A backup whose LFS
objects are in an S3 store is restored only if that store (or --lfs-store)
holds every object its index names.`, stderr)
	dir := fs.String("data", datadir.Dir(), "the new data directory; $"+datadir.EnvDir+" sets the default")
	fs.BoolVar(&opts.Copy, "copy", false, "copy object files even where a hard link would do")
	fs.StringVar(&opts.LFSStore, "lfs-store", "", "the S3 store to check for the backup's LFS objects (default: the one the backup records)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(args, pos, 1, 1, "restore BACKUP --data NEWDIR [--copy] [--lfs-store URL]"); err != nil {
		return err
	}
	start := time.Now()
	opts.Log = func(format string, args ...any) { fmt.Fprintf(stdout, format+"\n", args...) }
	m, stats, err := backup.Restore(ctx, pos[0], *dir, opts)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	fmt.Fprintf(stdout, "restored %d repositories from the backup of %s (packwire %s, %s) into %s in %s (%s copied, %s hard-linked)\n",
		len(m.Repositories), m.Source, m.Version, m.Created.Format(time.RFC3339), *dir, time.Since(start).Round(time.Millisecond),
		bytesText(stats.Copied), bytesText(stats.Linked))
	return nil
}
