package oid

import (
	"strings"
	"testing"
)

func TestValid(t *testing.T) {
	sha1 := "0123456789abcdef0123456789abcdef01234567"
	sha256 := sha1 + "89abcdef0123456789abcdef"
	for _, tc := range []struct {
		s    string
		want bool
	}{
		{sha1, true},
		{sha256, true},
		{strings.ToUpper(sha1), false}, // git writes lowercase
		{sha1[:39], false},
		{sha1 + "0", false},
		{sha1[:39] + "g", false},
		{"", false},
	} {
		if got := Valid(tc.s); got != tc.want {
			t.Errorf("Valid(%q) = %v, want %v", tc.s, got, tc.want)
		}
		if got := Valid([]byte(tc.s)); got != tc.want {
			t.Errorf("Valid([]byte(%q)) = %v, want %v", tc.s, got, tc.want)
		}
	}
}
