package packcache

import (
	"testing"

	"packwire/internal/diskspace"
)

// The free-space check reads the real file system: some space is free, and
// not 4 EiB of it.
func TestEnoughDisk(t *testing.T) {
	c := newCache(t)
	c.MinFreeBytes = 1
	if !c.enoughDisk() {
		free, err := diskspace.Free(c.Dir)
		t.Fatalf("enoughDisk for 1 byte = false (free %d, %v)", free, err)
	}
	c.MinFreeBytes = 1 << 62
	if c.enoughDisk() {
		t.Fatal("enoughDisk for 4 EiB = true")
	}
}
