package main

import (
	"encoding/json"
	"os/user"
	"strings"
	"testing"

	"packwire/internal/gittest"
	"packwire/internal/store"
)

// TestAuditLog: every change an admin command makes is recorded with the OS
// user who ran it, and packwire audit shows it (newest first).
func TestAuditLog(t *testing.T) {
	env := gittest.New(t)
	data := newData(t)
	key := env.NewSSHKey("k")
	steps := [][]string{
		{"user", "add", "alice", "--key", key + ".pub"},
		{"grant", "alice", "write", "team/*"},
		{"token", "create", "alice", "--scope", "metrics"},
		{"protect", "team/*", "refs/heads/main"},
		{"anonymous-read", "off"},
		{"repo", "create", "team/app"},
		{"repo", "set-description", "team/app", "the app"},
		{"repo", "rename", "team/app", "team/core"},
		{"hook", "add", "team/*", "https://ci:hunter2@ci.example/hook?token=s3cret", "--secret", "hook-secret"},
		{"repo", "mirror", "add", "team/core", "https://bob:pw-xyz@mirror.example/core"},
		{"repo", "mirror", "remove", "team/core", "1"},
		{"hook", "remove", "1"},
		{"repo", "delete", "team/core"},
		{"revoke", "alice", "team/*"},
		{"user", "remove", "alice"},
	}
	for i, s := range steps {
		if out, code := packwire(t, append(s, "--data", data)...); code != 0 {
			t.Fatalf("packwire %s: %d %s", strings.Join(s, " "), code, out)
		}
		if i == 3 { // user show, once alice has a key, a grant and a token
			out, code := packwire(t, "user", "show", "alice", "--data", data)
			if code != 0 || !strings.Contains(out, "keys: 1") || !strings.Contains(out, "write on team/*") ||
				!strings.Contains(out, "scope metrics, active") || strings.Contains(out, "pwt_") {
				t.Fatalf("user show: %d\n%s", code, out)
			}
		}
	}
	out, code := packwire(t, "audit", "--json", "--limit", "0", "--data", data)
	if code != 0 {
		t.Fatalf("audit: %d %s", code, out)
	}
	var entries []store.AuditEntry
	if err := json.Unmarshal([]byte(out), &entries); err != nil {
		t.Fatalf("audit --json: %v\n%s", err, out)
	}
	me, _ := user.Current()
	var got []string
	for i := len(entries) - 1; i >= 0; i-- { // oldest first, as the steps ran
		e := entries[i]
		if e.Actor != "cli:"+me.Username {
			t.Errorf("entry %+v: actor %q, want cli:%s", e, e.Actor, me.Username)
		}
		got = append(got, e.Action+" "+e.Target)
	}
	want := []string{"user add alice", "key add alice", "grant alice", "token create alice", "rule add #1", "rule add #2",
		"setting anonymous-read", "repo create team/app", "repo set-description team/app", "repo rename team/app",
		"hook add team/*", "repo mirror add team/core", "repo mirror remove team/core", "hook remove team/*", "repo delete team/core", "revoke alice", "user remove alice"}
	if strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Fatalf("audit log:\n got %s\nwant %s", strings.Join(got, "; "), strings.Join(want, "; "))
	}
	// The text form: newest first, with a header.
	out, _ = packwire(t, "audit", "--limit", "2", "--data", data)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.Contains(lines[1], "user remove") || !strings.Contains(lines[2], "revoke") {
		t.Fatalf("audit text:\n%s", out)
	}
	// Secrets never reach it: a token's id is recorded, never the token.
	all, _ := packwire(t, "audit", "--json", "--limit", "0", "--data", data)
	for _, secret := range []string{"hunter2", "s3cret", "hook-secret", "pw-xyz"} {
		if strings.Contains(all, secret) {
			t.Errorf("the audit log holds the secret %q:\n%s", secret, all)
		}
	}
	if !strings.Contains(all, "https://ci.example/hook") {
		t.Errorf("the hook's URL (without credentials) is not recorded:\n%s", all)
	}
	if strings.Contains(all, "pwt_") {
		t.Fatalf("a token in the audit log:\n%s", all)
	}
}
