//go:build !linux

package repostate

import "time"

// Without inotify every stamp is a walk.
func keptRefs(repoPath string, now time.Time) (Stamp, error) {
	st, _, err := walkRefs(repoPath, now, nil)
	return st, err
}
