package diskspace

import "testing"

// Free reads the real file system: some space is free, and not 4 EiB of it
// (-1 means this platform cannot tell).
func TestFree(t *testing.T) {
	free, err := Free(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if free != -1 && (free <= 0 || free >= 1<<62) {
		t.Fatalf("free = %d", free)
	}
}
