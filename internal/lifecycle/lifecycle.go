// Package lifecycle deletes, restores and renames served repositories. Each
// is one rename(2) under the repository root, taken under the repository's
// move lock (internal/repolock) without waiting: refused while a push,
// maintenance or backup works in the repository, which the server and the
// admin CLI, separate processes, both see. Deleted repositories wait in the
// trash for a grace period; ExpireTrash removes them after it.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"packwire/internal/access"
	"packwire/internal/repo"
	"packwire/internal/repolock"
	"packwire/internal/store"
)

// DefaultTrashRetention is how long a deleted repository stays restorable
// unless told otherwise: a week covers "deleted on Friday, missed on Monday".
const DefaultTrashRetention = 7 * 24 * time.Hour

// ErrBusy is returned when a push, maintenance or backup works in the
// repository: moving it then would fail them.
var ErrBusy = errors.New("in use")

// Delete moves the repository into the trash; clients get "not found" from
// then on.
func Delete(root repo.Root, raw string, now time.Time) (repo.Trashed, error) {
	var t repo.Trashed
	err := whileHeld(root, raw, func(r repo.Repo) (err error) {
		t, err = root.MoveToTrash(r, now)
		return err
	})
	return t, err
}

// Rename moves the repository to a new name. Grants and rules are patterns
// and stay as they are (see AccessChanges).
func Rename(root repo.Root, oldRaw, newRaw string) (from, to repo.Repo, err error) {
	if _, err := repo.CleanName(newRaw); err != nil {
		return from, to, fmt.Errorf("%q: %w", newRaw, err)
	}
	err = whileHeld(root, oldRaw, func(r repo.Repo) (err error) {
		from = r
		to, err = root.Move(r, newRaw)
		return err
	})
	return from, to, err
}

// whileHeld resolves raw and runs move on it under its exclusive move lock.
func whileHeld(root repo.Root, raw string, move func(repo.Repo) error) error {
	r, err := root.Resolve(raw)
	if err != nil {
		return err
	}
	lock, err := repolock.TryExclusive(r.Path)
	switch {
	case errors.Is(err, repolock.ErrBusy):
		return fmt.Errorf("%s is %w: a push, maintenance or backup is running in it; try again when it ends", r.Name, ErrBusy)
	case errors.Is(err, repolock.ErrMoved):
		return repo.ErrNotFound // moved by someone else meanwhile
	case err != nil:
		return err
	}
	defer lock.Release()
	if repolock.ReleaseBeforeMove {
		lock.Release()
	}
	return move(r)
}

// Restore moves a deleted repository back under its name: the version
// deleted at stamp (repo.TrashStamp), or the last one deleted if stamp is
// empty. It refuses if a repository of that name exists again.
func Restore(root repo.Root, raw, stamp string) (repo.Repo, repo.Trashed, error) {
	name, err := repo.CleanName(raw)
	if err != nil {
		return repo.Repo{}, repo.Trashed{}, err
	}
	list, err := root.ListTrash()
	if err != nil {
		return repo.Repo{}, repo.Trashed{}, err
	}
	var pick repo.Trashed
	var stamps []string
	for _, t := range list { // oldest first: the last match is the newest
		if t.Name != name {
			continue
		}
		stamps = append(stamps, t.Stamp())
		if stamp == "" || t.Stamp() == stamp {
			pick = t
		}
	}
	if pick.Path == "" {
		if len(stamps) > 0 {
			return repo.Repo{}, repo.Trashed{}, fmt.Errorf("%s was not deleted at %s; deleted versions: %s", name, stamp, strings.Join(stamps, ", "))
		}
		return repo.Repo{}, repo.Trashed{}, fmt.Errorf("%s: %w", name, repo.ErrNotInTrash)
	}
	r, err := root.Untrash(pick)
	return r, pick, err
}

// ExpireTrash removes, for good, the deleted repositories older than
// retention. It returns what it removed, and the errors of the others.
func ExpireTrash(root repo.Root, retention time.Duration, now time.Time) ([]repo.Trashed, error) {
	list, err := root.ListTrash()
	if err != nil {
		return nil, err
	}
	var removed []repo.Trashed
	var errs error
	for _, t := range list {
		if now.Sub(t.Deleted) <= retention {
			continue
		}
		if err := root.RemoveTrashed(t); err != nil {
			errs = errors.Join(errs, err)
			continue
		}
		removed = append(removed, t)
	}
	return removed, errs
}

// AccessChange is an access pattern whose reach a rename changed.
type AccessChange struct {
	What string // "grant", "rule" or "anonymous-read"
	Text string // the grant, rule or setting as the CLI writes it
	// Lost: it matched the old name and not the new one; otherwise it
	// matches the new name and did not match the old one.
	Lost bool
}

// AccessChanges lists the grants, ref rules and anonymous-read overrides
// that matched oldName and do not match newName, and the reverse: a rename
// leaves patterns as they are, so these are what the admin may need to fix.
func AccessChanges(ctx context.Context, st *store.Store, oldName, newName string) ([]AccessChange, error) {
	var changes []AccessChange
	add := func(what, pattern, text string) {
		was, is := access.Match(pattern, oldName), access.Match(pattern, newName)
		if was != is {
			changes = append(changes, AccessChange{What: what, Text: text, Lost: was})
		}
	}
	grants, err := st.Grants(ctx, "")
	if err != nil {
		return nil, err
	}
	for _, g := range grants {
		add("grant", g.RepoPattern, fmt.Sprintf("%s %s '%s'", g.User, g.Role, g.RepoPattern))
	}
	rules, err := st.Rules(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range rules {
		add("rule", r.RepoPattern, fmt.Sprintf("#%d %s", r.Position, access.RuleText(r)))
	}
	anon, err := st.AnonReads(ctx)
	if err != nil {
		return nil, err
	}
	for _, a := range anon {
		state := "off"
		if a.Enabled {
			state = "on"
		}
		add("anonymous-read", a.RepoPattern, fmt.Sprintf("%s '%s'", state, a.RepoPattern))
	}
	return changes, nil
}
