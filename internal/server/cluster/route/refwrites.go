package route

import (
	"context"

	"packwire/internal/repolock"
)

// refWritesLock is the file in a copy that orders the two ways its refs
// are written from another node: a primary's replication of a push (and
// the set-back of a failed one), and this node's catch-up. A catch-up's
// pruning fetch that ran after a push had been applied here, from a
// source that did not yet show it, would delete the push from a copy
// that voted for it and is recorded at its generation (bench/chaos,
// pg-down). So each holds the lock while it writes, and a catch-up that
// got it checks again that the copy is still recorded behind.
const refWritesLock = "packwire-refs.lock"

// lockRefWrites waits for dir's ref writes to be this caller's alone,
// across processes too (a flock, dropped by the kernel if the holder
// dies), until ctx ends.
func lockRefWrites(ctx context.Context, dir string) (*repolock.Lock, error) {
	return repolock.Serial(ctx, dir, refWritesLock)
}
