//go:build linux

package main

import "testing"

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
