package maintain

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
)

// BundleFile is the clone bundle a full run writes in the repository
// (gitformat-bundle v2): a header naming the branches, tags and HEAD the
// preferred pack is the closure of, then that pack's bytes unchanged. It
// is derived (the next full run writes it again), so backups leave it out
// and it moves and goes with the repository's directory.
const BundleFile = "packwire-clone.bundle"

// bundleSignature starts a v2 bundle; no prerequisites: the pack is closed.
const bundleSignature = "# v2 git bundle\n"

// NamedRef is one ref of a snapshot.
type NamedRef struct {
	Name string // "refs/heads/main", "HEAD"
	ID   string
}

// writeBundle writes the clone bundle of the repository at dir from its
// preferred pack, atomically (a temporary file synced and renamed): a
// client never reads half a bundle. The pack is copied by the kernel
// (copy_file_range: no pass through user space, a reflink where the file
// system has them) rather than packed again by `git bundle create`.
func writeBundle(dir, pack string, refs []NamedRef) error {
	tmp := filepath.Join(dir, BundleFile+".tmp")
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	err = func() error {
		w := bufio.NewWriter(f)
		w.WriteString(bundleSignature)
		for _, r := range refs {
			w.WriteString(r.ID + " " + r.Name + "\n")
		}
		w.WriteString("\n")
		if err := w.Flush(); err != nil {
			return err
		}
		p, err := os.Open(pack)
		if err != nil {
			return err
		}
		defer p.Close()
		if _, err := io.Copy(f, p); err != nil {
			return err
		}
		return f.Sync()
	}()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, BundleFile))
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// removeBundle removes the clone bundle (a repository with nothing to clone).
func removeBundle(dir string) { os.Remove(filepath.Join(dir, BundleFile)) }
