//go:build !unix && !windows

package diskspace

// Free cannot tell here: -1, and the free-space bound is not applied.
func Free(string) (int64, error) { return -1, nil }
