package access

import (
	"fmt"
	"strings"
)

// Match reports whether name (a repository name like team/app, or a ref
// name like refs/heads/main) matches pattern. A pattern is a path of
// segments separated by '/': "*" within a segment matches any run of
// characters other than '/', and a whole segment "**" matches any number
// of segments (zero or more), so "**" matches everything and "team/**"
// matches team/app and team/a/b. Every other character is literal.
func Match(pattern, name string) bool {
	return matchSegs(strings.Split(pattern, "/"), strings.Split(name, "/"))
}

func matchSegs(pat, name []string) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			rest := pat[1:]
			for i := 0; i <= len(name); i++ {
				if matchSegs(rest, name[i:]) {
					return true
				}
			}
			return false
		}
		if len(name) == 0 || !matchSeg(pat[0], name[0]) {
			return false
		}
		pat, name = pat[1:], name[1:]
	}
	return len(name) == 0
}

// matchSeg matches one segment with '*' wildcards (iterative, no backtracking blowup).
func matchSeg(pat, s string) bool {
	px, sx := 0, 0
	starPx, starSx := -1, 0
	for sx < len(s) {
		switch {
		case px < len(pat) && pat[px] == '*':
			starPx, starSx = px, sx
			px++
		case px < len(pat) && pat[px] == s[sx]:
			px++
			sx++
		case starPx >= 0:
			px = starPx + 1
			starSx++
			sx = starSx
		default:
			return false
		}
	}
	for px < len(pat) && pat[px] == '*' {
		px++
	}
	return px == len(pat)
}

// ValidPattern checks a repository or ref pattern: non-empty segments, no
// "." or ".." segments, printable characters only.
func ValidPattern(p string) error {
	if p == "" || len(p) > 1024 {
		return fmt.Errorf("invalid pattern %q: empty or too long", p)
	}
	for _, c := range p {
		if c < 0x20 || c == 0x7f || c == '\\' || c == ' ' {
			return fmt.Errorf("invalid pattern %q: control character, space or backslash", p)
		}
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("invalid pattern %q: empty, '.' or '..' segment", p)
		}
	}
	return nil
}

// specificity orders patterns from least to most specific: the number of
// literal (non-wildcard) characters.
func specificity(p string) int {
	n := 0
	for _, c := range p {
		if c != '*' {
			n++
		}
	}
	return n
}
