package maintain

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"packwire/internal/repo"
)

// DefaultQuarantineAge is how long nothing may have been written in a
// push's quarantine before it counts as abandoned, for a server with the
// default --timeout (10m): see QuarantineAge.
const DefaultQuarantineAge = time.Hour

// QuarantineAge is the age for a server that ends a request after idle
// with no data moving: twice that, and at least an hour. A live push
// writes into its quarantine as its pack arrives; once the pack is in,
// receive-pack checks connectivity and moves the objects, with keepalives
// on the wire and nothing written, usually for seconds. A push that stalls
// is killed after idle. So a quarantine untouched for twice that and an
// hour belongs to no running push. Erring late costs disk for a while;
// removing a live one would only fail that push (git moves objects into
// place before it updates refs), never the repository.
func QuarantineAge(idle time.Duration) time.Duration {
	return max(2*idle, DefaultQuarantineAge)
}

// Quarantine is a push's temporary object directory.
type Quarantine struct {
	Path      string    // absolute
	Name      string    // relative to the repository: "objects/tmp_objdir-incoming-XXXXXX"
	Bytes     int64     // of the files in it
	LastWrite time.Time // newest modification of anything in it
}

// isQuarantine reports whether an entry of objects/ is a temporary object
// directory of git's: tmp_objdir-<prefix>-XXXXXX since git 2.35 (prefix
// "incoming" for receive-pack, "bulk-fsync" for batched fsync),
// incoming-XXXXXX before.
func isQuarantine(name string) bool {
	return strings.HasPrefix(name, "tmp_objdir-") || strings.HasPrefix(name, "incoming-")
}

// Quarantines lists the temporary object directories in the repository at
// dir.
func Quarantines(dir string) ([]Quarantine, error) {
	objects := filepath.Join(dir, "objects")
	entries, err := os.ReadDir(objects)
	if err != nil {
		return nil, err
	}
	var qs []Quarantine
	for _, e := range entries {
		if !e.IsDir() || !isQuarantine(e.Name()) {
			continue
		}
		q := Quarantine{Path: filepath.Join(objects, e.Name()), Name: "objects/" + e.Name()}
		// Errors are skipped: the push may be moving or removing files now.
		filepath.WalkDir(q.Path, func(_ string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			fi, err := d.Info()
			if err != nil {
				return nil
			}
			if fi.ModTime().After(q.LastWrite) {
				q.LastWrite = fi.ModTime()
			}
			if fi.Mode().IsRegular() {
				q.Bytes += fi.Size()
			}
			return nil
		})
		qs = append(qs, q)
	}
	return qs, nil
}

// StaleQuarantines lists the quarantines in which nothing was written for
// the Maintainer's QuarantineAge.
func (m *Maintainer) StaleQuarantines(dir string) ([]Quarantine, error) {
	qs, err := Quarantines(dir)
	var stale []Quarantine
	for _, q := range qs {
		if time.Since(q.LastWrite) > time.Duration(m.quarantineAge.Load()) {
			stale = append(stale, q)
		}
	}
	return stale, err
}

// RemoveStaleQuarantines removes what pushes that were killed left behind.
// receive-pack keeps a push's objects in a quarantine under objects/ until
// its refs are updated and removes it when it exits, but not when it is
// killed with SIGKILL (packwire's own kill of a push whose client hung up
// or stalled, or kill -9 of the server): tens of MB could stay forever.
// Each removal is logged with its size; it returns what it removed.
func (m *Maintainer) RemoveStaleQuarantines(r repo.Repo) []Quarantine {
	stale, err := m.StaleQuarantines(r.Path)
	if err != nil {
		m.Log.Warn("maintenance: listing push quarantines", "repo", r.Name, "error", err.Error())
	}
	var removed []Quarantine
	for _, q := range stale {
		if err := os.RemoveAll(q.Path); err != nil {
			m.Log.Warn("maintenance: removing a stale push quarantine", "repo", r.Name, "dir", q.Name, "error", err.Error())
			continue
		}
		m.Log.Info("maintenance: removed a stale push quarantine", "repo", r.Name, "dir", q.Name, "bytes", q.Bytes,
			"last_write", q.LastWrite.UTC().Format(time.RFC3339))
		removed = append(removed, q)
	}
	return removed
}
