package pipeline

import "testing"

// TestSpoolSetBounds: bodies on disk stay across new bounds; the next
// body is held to them, per address and in all.
func TestSpoolSetBounds(t *testing.T) {
	s := &Spool{Max: 100, MaxPerAddr: 60}
	if err := s.reserve("a", 50); err != nil {
		t.Fatal(err)
	}
	s.SetBounds(300, 200)
	if err := s.reserve("a", 100); err != nil {
		t.Fatalf("under the larger bounds: %v", err)
	}
	s.SetBounds(200, 160)
	if err := s.reserve("a", 20); err == nil {
		t.Fatal("a body past the smaller per-address bound was taken")
	}
	if err := s.reserve("b", 60); err == nil {
		t.Fatal("a body past the smaller bound in all was taken")
	}
	if err := s.reserve("b", 50); err != nil {
		t.Fatalf("a body within both bounds: %v", err)
	}
}
