//go:build linux

package main

import (
	"testing"
	"time"
)

// TestParseRefsRefusesASplitLine: the long run's one "stale read" was an
// ls-remote line split by ssh's stderr (combined output), its object name
// cut after 11 digits. Such output fails the read; it is not a ref at a
// wrong commit.
func TestParseRefsRefusesASplitLine(t *testing.T) {
	good := "e39aef29868caa3ae9b9882aced659c0c6216a76\tHEAD\n" +
		"e39aef29868caa3ae9b9882aced659c0c6216a76\trefs/heads/b-78\n"
	refs, err := parseRefs(good)
	if err != nil || refs["refs/heads/b-78"] != "e39aef29868caa3ae9b9882aced659c0c6216a76" || len(refs) != 1 {
		t.Fatalf("parseRefs(good) = %v, %v", refs, err)
	}
	split := "e39aef29868\nConnection to 127.0.0.1 closed by remote host.\n" +
		"caa3ae9b9882aced659c0c6216a76\trefs/heads/b-78\n"
	if refs, err := parseRefs(split); err == nil {
		t.Fatalf("parseRefs took a split line: %v", refs)
	}
	if refs, err := parseRefs(""); err != nil || len(refs) != 0 {
		t.Fatalf("parseRefs(empty) = %v, %v", refs, err)
	}
}

// TestLongestGap: the longest time without an acknowledged push, and
// when it began, counting from the first fault and up to the end (a
// repository that never takes a push again is stuck until the end).
func TestLongestGap(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 21, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	pushes := []pushRecord{
		{end: at(1), acked: true},
		{end: at(3), acked: true},
		{end: at(30), acked: false}, // a refusal ends no window
		{end: at(40), acked: true},
		{end: at(41), acked: true},
	}
	if gap, from := longestGap(pushes, at(0), at(45)); gap != 37*time.Second || !from.Equal(at(3)) {
		t.Fatalf("longestGap = %v from %v, want 37s from +3s", gap, from.Sub(t0))
	}
	if gap, from := longestGap(pushes[:2], at(0), at(45)); gap != 42*time.Second || !from.Equal(at(3)) {
		t.Fatalf("longestGap, no push after +3s = %v from %v, want 42s from +3s (to the end)", gap, from.Sub(t0))
	}
}
