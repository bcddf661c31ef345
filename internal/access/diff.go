package access

import (
	"context"
	"fmt"
	"sort"

	"packwire/internal/store"
)

// Change is one difference between two access models, as access import
// reports it (and --dry-run shows without making it).
type Change struct {
	Op   byte   // '+' added, '-' removed, '~' changed
	Kind string // user, key, token, grant, rule, anonymous-read
	Text string
}

func (c Change) String() string { return fmt.Sprintf("%c %s %s", c.Op, c.Kind, c.Text) }

// Current reads the whole access model from the store, tokens included.
func (c *Controller) Current(ctx context.Context) (store.Model, error) {
	st := c.Store
	var m store.Model
	var err error
	if m.AnonReadDefault, err = st.Setting(ctx, SettingAnonRead, "on"); err != nil {
		return m, err
	}
	if m.AnonReads, err = st.AnonReads(ctx); err != nil {
		return m, err
	}
	if m.Users, err = st.ListUsers(ctx); err != nil {
		return m, err
	}
	if m.Keys, err = st.Keys(ctx, ""); err != nil {
		return m, err
	}
	if m.Grants, err = st.Grants(ctx, ""); err != nil {
		return m, err
	}
	if m.Rules, err = st.Rules(ctx); err != nil {
		return m, err
	}
	m.Tokens, err = st.Tokens(ctx)
	return m, err
}

// Diff lists what replacing cur with next changes, as ReplaceModel does
// it: users not in next go with their keys, tokens and grants; users that
// stay keep their tokens; rules are compared in order.
func Diff(cur, next store.Model) []Change {
	var out []Change
	add := func(op byte, kind, format string, args ...any) {
		out = append(out, Change{Op: op, Kind: kind, Text: fmt.Sprintf(format, args...)})
	}

	if cur.AnonReadDefault != next.AnonReadDefault {
		add('~', "anonymous-read", "server-wide: %s -> %s", cur.AnonReadDefault, next.AnonReadDefault)
	}
	curAnon := map[string]bool{}
	for _, a := range cur.AnonReads {
		curAnon[a.RepoPattern] = a.Enabled
	}
	nextAnon := map[string]bool{}
	for _, a := range next.AnonReads {
		nextAnon[a.RepoPattern] = a.Enabled
		was, ok := curAnon[a.RepoPattern]
		switch {
		case !ok:
			add('+', "anonymous-read", "%s: %s", a.RepoPattern, onOff(a.Enabled))
		case was != a.Enabled:
			add('~', "anonymous-read", "%s: %s -> %s", a.RepoPattern, onOff(was), onOff(a.Enabled))
		}
	}
	for _, a := range cur.AnonReads {
		if _, ok := nextAnon[a.RepoPattern]; !ok {
			add('-', "anonymous-read", "%s: %s", a.RepoPattern, onOff(a.Enabled))
		}
	}

	curUsers, nextUsers := map[string]bool{}, map[string]bool{}
	for _, u := range cur.Users {
		curUsers[u.Name] = true
	}
	for _, u := range next.Users {
		nextUsers[u.Name] = true
	}
	tokens := map[string]int{}
	for _, t := range cur.Tokens {
		tokens[t.User]++
	}
	for _, u := range next.Users {
		if !curUsers[u.Name] {
			add('+', "user", "%s", u.Name)
		}
	}
	for _, u := range cur.Users {
		if !nextUsers[u.Name] {
			add('-', "user", "%s", u.Name)
		}
	}
	// Tokens cannot be imported: they only go, with their user.
	for _, t := range cur.Tokens {
		if !nextUsers[t.User] {
			add('-', "token", "%s of %s", t.ID, t.User)
		}
	}

	curKeys := map[string]store.Key{}
	for _, k := range cur.Keys {
		curKeys[k.Fingerprint] = k
	}
	nextKeys := map[string]bool{}
	for _, k := range next.Keys {
		nextKeys[k.Fingerprint] = true
		was, ok := curKeys[k.Fingerprint]
		switch {
		case !ok:
			add('+', "key", "%s %s%s", k.User, k.Fingerprint, comment(k.Comment))
		case was.User != k.User:
			add('~', "key", "%s%s: %s -> %s", k.Fingerprint, comment(k.Comment), was.User, k.User)
		}
	}
	for _, k := range cur.Keys {
		if !nextKeys[k.Fingerprint] {
			add('-', "key", "%s %s%s", k.User, k.Fingerprint, comment(k.Comment))
		}
	}

	type grantKey struct{ user, repo string }
	curGrants := map[grantKey]string{}
	for _, g := range cur.Grants {
		curGrants[grantKey{g.User, g.RepoPattern}] = g.Role
	}
	nextGrants := map[grantKey]bool{}
	for _, g := range next.Grants {
		k := grantKey{g.User, g.RepoPattern}
		nextGrants[k] = true
		was, ok := curGrants[k]
		switch {
		case !ok:
			add('+', "grant", "%s %s %s", g.User, g.Role, g.RepoPattern)
		case was != g.Role:
			add('~', "grant", "%s on %s: %s -> %s", g.User, g.RepoPattern, was, g.Role)
		}
	}
	for _, g := range cur.Grants {
		if !nextGrants[grantKey{g.User, g.RepoPattern}] {
			add('-', "grant", "%s %s %s", g.User, g.Role, g.RepoPattern)
		}
	}

	out = append(out, diffRules(cur.Rules, next.Rules)...)
	return out
}

// diffRules compares two ordered rule lists through their longest common
// subsequence, so that a rule inserted at the top shows as one addition,
// not as every rule changed. Positions are the old list's for removals and
// the new list's for additions.
func diffRules(cur, next []store.Rule) []Change {
	a := make([]string, len(cur))
	for i, r := range cur {
		a[i] = RuleText(r)
	}
	b := make([]string, len(next))
	for i, r := range next {
		b[i] = RuleText(r)
	}
	// lcs[i][j]: length of the longest common subsequence of a[i:], b[j:].
	lcs := make([][]int, len(a)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(b)+1)
	}
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out []Change
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case i < len(a) && j < len(b) && a[i] == b[j]:
			i++
			j++
		case j < len(b) && (i == len(a) || lcs[i][j+1] >= lcs[i+1][j]):
			out = append(out, Change{Op: '+', Kind: "rule", Text: fmt.Sprintf("#%d %s", j+1, b[j])})
			j++
		default:
			out = append(out, Change{Op: '-', Kind: "rule", Text: fmt.Sprintf("#%d %s", i+1, a[i])})
			i++
		}
	}
	// Removals first, then additions, each in list order: easier to read.
	sort.SliceStable(out, func(x, y int) bool { return out[x].Op == '-' && out[y].Op == '+' })
	return out
}

func comment(c string) string {
	if c == "" {
		return ""
	}
	return " (" + c + ")"
}
