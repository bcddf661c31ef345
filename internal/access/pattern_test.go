package access

import "testing"

func TestMatch(t *testing.T) {
	cases := []struct {
		pat, name string
		want      bool
	}{
		{"**", "app", true},
		{"**", "team/a/b", true},
		{"team/*", "team/app", true},
		{"team/*", "team/a/b", false},
		{"team/*", "other/app", false},
		{"team/**", "team/a/b", true},
		{"team/**", "team", true},
		{"team/app", "team/app", true},
		{"team/app", "Team/app", false},
		{"refs/heads/main", "refs/heads/main", true},
		{"refs/tags/**", "refs/tags/v1", true},
		{"refs/tags/**", "refs/heads/v1", false},
		{"refs/heads/feature-*", "refs/heads/feature-x", true},
		{"refs/heads/feature-*", "refs/heads/feature-x/y", false},
		{"refs/**/main", "refs/heads/main", true},
		{"a*b*c", "aXXbYYc", true},
		{"a*b*c", "aXXbYY", false},
		{"*", "", true},
	}
	for _, c := range cases {
		if got := Match(c.pat, c.name); got != c.want {
			t.Errorf("Match(%q, %q) = %v, want %v", c.pat, c.name, got, c.want)
		}
	}
}

func FuzzMatch(f *testing.F) {
	f.Add("team/**/x*y", "team/a/b/xzy")
	f.Fuzz(func(t *testing.T, pat, name string) {
		if len(pat) > 64 || len(name) > 256 {
			return
		}
		Match(pat, name)
	})
}
