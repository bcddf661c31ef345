package lfs

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"time"
)

// Missing checks that st holds, at its size, every object the index at
// indexPath (a SQLite index file: a backup's) names: how many it names
// and those st lacks (or holds at another size), at most maxListed of
// them listed, and the number missing. One listing of st (Walk), not a
// request per object.
func Missing(ctx context.Context, indexPath string, st Store, maxListed int) (named, missing int, listed []string, err error) {
	x, err := OpenIndex(ctx, indexPath)
	if err != nil {
		return 0, 0, nil, err
	}
	defer x.Close()
	want := map[string]int64{}
	rows, err := x.st.DB.QueryContext(ctx, "SELECT DISTINCT oid, size FROM lfs_objects")
	if err != nil {
		return 0, 0, nil, err
	}
	for rows.Next() {
		var oid string
		var size int64
		if err := rows.Scan(&oid, &size); err != nil {
			rows.Close()
			return 0, 0, nil, err
		}
		want[oid] = size
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, 0, nil, err
	}
	named = len(want)
	err = st.Walk(ctx, func(oid string, size int64, _ time.Time) error {
		if w, ok := want[oid]; ok && w == size {
			delete(want, oid)
		}
		return nil
	})
	if err != nil {
		return named, 0, nil, fmt.Errorf("listing the LFS store: %w", err)
	}
	for oid := range want {
		listed = append(listed, oid)
	}
	slices.Sort(listed)
	return named, len(want), listed[:min(len(listed), maxListed)], nil
}

// IndexPath is the index file of a data directory (or of a backup, laid
// out as one).
func IndexPath(dataDir string) string { return filepath.Join(Dir(dataDir), IndexFile) }
