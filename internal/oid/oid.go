// Package oid knows what a git object id looks like in text: 40 (SHA-1)
// or 64 (SHA-256) lowercase hex digits, as git prints and sends them.
package oid

// Valid reports whether s is a SHA-1 or SHA-256 object id in lowercase hex.
func Valid[T ~string | ~[]byte](s T) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
