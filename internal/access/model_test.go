package access

import (
	"errors"
	"testing"

	"packwire/internal/store"
)

func TestModelDecide(t *testing.T) {
	alice := Principal{User: "alice", Via: "token"}
	bob := Principal{User: "bob", Via: "ssh-key"}
	m := &Model{
		AnonReadDefault: false,
		AnonReads:       []store.AnonRead{{RepoPattern: "pub/**", Enabled: true}, {RepoPattern: "pub/secret", Enabled: false}},
		Grants: []store.Grant{
			{User: "alice", RepoPattern: "team/*", Role: "read"},
			{User: "alice", RepoPattern: "team/app", Role: "write"},
			{User: "bob", RepoPattern: "**", Role: "admin"},
		},
	}
	cases := []struct {
		p    Principal
		op   Op
		repo string
		want error
	}{
		{Anonymous, Read, "pub/lib", nil},
		{Anonymous, Read, "pub/a/b", nil},
		{Anonymous, Read, "pub/secret", ErrNoRead},
		{Anonymous, Read, "team/app", ErrNoRead},
		{Anonymous, Write, "pub/lib", ErrAuthRequired},
		{alice, Read, "team/lib", nil},
		{alice, Write, "team/lib", ErrDenied},
		{alice, Write, "team/app", nil}, // highest matching grant
		{alice, Read, "team/a/b", ErrNoRead},
		{alice, Read, "pub/lib", nil},
		{alice, Write, "pub/lib", ErrDenied},
		{bob, Write, "anything/at/all", nil},
	}
	for _, c := range cases {
		err := m.Decide(c.p, c.op, c.repo)
		if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%s %s %s: %v, want %v", c.p, c.op, c.repo, err, c.want)
		}
	}
	if m.Role(bob, "x") != RoleAdmin || m.Role(alice, "team/app") != RoleWrite || m.Role(Anonymous, "team/app") != RoleNone {
		t.Error("roles")
	}
}

func TestAnonReadSpecificity(t *testing.T) {
	m := &Model{AnonReadDefault: true, AnonReads: []store.AnonRead{
		{RepoPattern: "**", Enabled: false},
		{RepoPattern: "team/*", Enabled: true},
		{RepoPattern: "team/*", Enabled: false}, // same specificity: off wins
		{RepoPattern: "oss/**", Enabled: true},
	}}
	for repo, want := range map[string]bool{"x": false, "team/app": false, "oss/a/b": true} {
		if got := m.AnonRead(repo); got != want {
			t.Errorf("AnonRead(%s) = %v", repo, got)
		}
	}
}

func TestDecideRefOrder(t *testing.T) {
	alice := Principal{User: "alice"}
	carol := Principal{User: "carol"}
	m := &Model{
		Grants: []store.Grant{{User: "alice", RepoPattern: "**", Role: "write"}, {User: "carol", RepoPattern: "**", Role: "admin"}},
		Rules: []store.Rule{
			{Position: 1, Allow: true, Ops: "force-push,delete", RepoPattern: "**", RefPattern: "refs/heads/main", Who: "role:admin"},
			{Position: 2, Allow: false, Ops: "force-push,delete", RepoPattern: "**", RefPattern: "refs/heads/main", Who: "*"},
			{Position: 3, Allow: true, Ops: "create", RepoPattern: "team/*", RefPattern: "refs/tags/**", Who: "alice"},
			{Position: 4, Allow: false, Ops: "create", RepoPattern: "**", RefPattern: "refs/tags/**", Who: "*"},
		},
	}
	cases := []struct {
		p       Principal
		repo    string
		ref     string
		op      RefOp
		allowed bool
		rule    int
	}{
		{alice, "team/app", "refs/heads/main", OpForce, false, 2},
		{alice, "team/app", "refs/heads/main", OpPush, true, 0},
		{carol, "team/app", "refs/heads/main", OpForce, true, 1},
		{alice, "team/app", "refs/tags/v1", OpCreate, true, 3},
		{alice, "other/app", "refs/tags/v1", OpCreate, false, 4},
		{carol, "team/app", "refs/tags/v1", OpCreate, false, 4},
		{alice, "team/app", "refs/heads/x", OpDelete, true, 0},
	}
	for _, c := range cases {
		d := m.DecideRef(c.p, c.repo, c.ref, c.op)
		rule := 0
		if d.Rule != nil {
			rule = d.Rule.Position
		}
		if d.Allowed != c.allowed || rule != c.rule {
			t.Errorf("%s %s %s %s: allowed=%v by %s", c.p, c.repo, c.ref, c.op, d.Allowed, d.Why())
		}
	}
}

func TestParseOpsAndWho(t *testing.T) {
	if s, err := ParseOps("delete,force,create"); err != nil || s != "create,force-push,delete" {
		t.Fatalf("%q %v", s, err)
	}
	if s, _ := ParseOps("all"); s != "create,push,force-push,delete" {
		t.Fatal(s)
	}
	if _, err := ParseOps("rename"); err == nil {
		t.Fatal("rename accepted")
	}
	for _, ok := range []string{"*", "alice", "role:write"} {
		if ValidWho(ok) != nil {
			t.Errorf("%q rejected", ok)
		}
	}
	for _, bad := range []string{"", "role:owner", "a b", "a/b"} {
		if ValidWho(bad) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
