package lfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// A repository's LFS objects follow it: renamed with it, put aside with
// it in the trash (under a name no repository can have, so a new
// repository of the old name reads none of them), brought back with it,
// and forgotten when its trash entry expires. Content no repository holds
// any more is removed by Sweep after a grace period.

// trashName is the index's name for a deleted repository's objects.
// Repository names never start with '-' (repo.CleanName).
func trashName(name, stamp string) string { return trashPrefix + stamp + "/" + name }

const trashPrefix = "-trash/"

// withIndex opens the data directory's index for fn; without one (LFS
// never ran) there is nothing to change.
func withIndex(ctx context.Context, dataDir string, fn func(*Index) error) error {
	path := filepath.Join(Dir(dataDir), IndexFile)
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	x, err := OpenIndex(ctx, path)
	if err != nil {
		return err
	}
	defer x.Close()
	return fn(x)
}

// Renamed moves a renamed repository's objects and locks to its new name.
func Renamed(ctx context.Context, dataDir, from, to string) error {
	return withIndex(ctx, dataDir, func(x *Index) error { return x.RenameRepo(ctx, from, to) })
}

// Deleted puts a deleted repository's objects and locks aside with its
// trash entry (stamp).
func Deleted(ctx context.Context, dataDir, name, stamp string) error {
	return withIndex(ctx, dataDir, func(x *Index) error { return x.RenameRepo(ctx, name, trashName(name, stamp)) })
}

// Restored brings a restored repository's objects and locks back.
func Restored(ctx context.Context, dataDir, name, stamp string) error {
	return withIndex(ctx, dataDir, func(x *Index) error { return x.RenameRepo(ctx, trashName(name, stamp), name) })
}

// Expired forgets a trash entry removed for good; Sweep removes the
// content no other repository holds.
func Expired(ctx context.Context, dataDir, name, stamp string) error {
	return withIndex(ctx, dataDir, func(x *Index) error { return x.RemoveRepo(ctx, trashName(name, stamp)) })
}

// SweepGrace is how long content no repository holds stays before Sweep
// removes it.
const SweepGrace = 24 * time.Hour

// Sweep removes stored objects that no repository (nor trash entry) holds
// and that were stored more than grace ago: an upload's row is written
// just after its file, so a younger file may be one on its way in.
//
// On a cluster node it first forgets the rows of deletions that can no
// longer be restored (their trash entries expired on every node, or no
// node held a copy; on one server, expiring the trash does it).
func (s *Service) Sweep(ctx context.Context, grace time.Duration) (removed int, bytes int64, err error) {
	if s.Cluster != nil {
		if _, err := s.Index.ForgetDeleted(ctx, func(name, stamp string) (bool, error) {
			return s.Cluster.Restorable(ctx, name, stamp)
		}); err != nil {
			return 0, 0, fmt.Errorf("forgetting expired deletions: %w", err)
		}
	}
	cutoff := time.Now().Add(-grace)
	err = s.Objects.Walk(ctx, func(oid string, size int64, stored time.Time) error {
		if stored.After(cutoff) {
			return nil
		}
		held, err := s.Index.Held(ctx, oid)
		if err != nil {
			return err
		}
		if !held {
			if err := s.Objects.Remove(oid); err != nil {
				return err
			}
			removed++
			bytes += size
		}
		return nil
	})
	return removed, bytes, err
}
