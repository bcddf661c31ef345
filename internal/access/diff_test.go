package access

import (
	"slices"
	"testing"

	"packwire/internal/store"
)

// TestDiffRules: rules are compared in order, so a rule inserted at the
// top is one addition and a moved rule a removal and an addition, while
// unchanged rules are not mentioned.
func TestDiffRules(t *testing.T) {
	r := func(who string) store.Rule {
		return store.Rule{Ops: "push", RepoPattern: "**", RefPattern: "**", Who: who}
	}
	cur := store.Model{AnonReadDefault: "on", Rules: []store.Rule{r("a"), r("b"), r("c"), r("d")}}
	next := store.Model{AnonReadDefault: "on", Rules: []store.Rule{r("new"), r("a"), r("c"), r("d"), r("b")}}
	var got []string
	for _, c := range Diff(cur, next) {
		got = append(got, c.String())
	}
	want := []string{"- rule #2 deny push ** ** b", "+ rule #1 deny push ** ** new", "+ rule #5 deny push ** ** b"}
	if !slices.Equal(got, want) {
		t.Fatalf("Diff:\n%q\nwant\n%q", got, want)
	}
	if d := Diff(next, next); len(d) != 0 {
		t.Fatalf("Diff of a model with itself: %v", d)
	}
}
