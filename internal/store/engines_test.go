package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"packwire/internal/pgtest"
)

// TestEnginesAgree runs the same work through every method of the store on
// SQLite and on a real PostgreSQL and wants the same answers: one schema
// and one set of queries serve both engines.
func TestEnginesAgree(t *testing.T) {
	lite, pgStore := openBoth(t)
	want := exercise(t, lite)
	got := exercise(t, pgStore)
	if got != want {
		t.Fatalf("PostgreSQL and SQLite disagree.\nSQLite:\n%s\nPostgreSQL:\n%s", want, got)
	}
	// Something was exercised: the transcript is not empty answers.
	for _, s := range []string{"users [alice bob]", "ErrExists", "rule 1: deny delete", "hook 1", "delivered", "UsersRemovedError [bob]", "audit"} {
		if !strings.Contains(want, s) {
			t.Errorf("transcript lacks %q:\n%s", s, want)
		}
	}
}

// openBoth opens a new SQLite store and a new store on a throwaway
// PostgreSQL, closed at the end of the test.
func openBoth(t *testing.T) (lite, pg *Store) {
	t.Helper()
	ctx := WithActor(context.Background(), "cli:test")
	lite, err := Open(ctx, filepath.Join(t.TempDir(), "packwire.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lite.Close() })
	server := pgtest.Shared(t)
	pg, err = OpenPostgres(ctx, server.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	return lite, pg
}

// exercise drives st through users, keys, tokens, grants, settings,
// anonymous read, rules, the whole-model import, hooks, deliveries and the
// audit log, and returns what it saw, without times or generated ids.
func exercise(t *testing.T, st *Store) string {
	t.Helper()
	ctx := WithActor(context.Background(), "cli:test")
	var b strings.Builder
	say := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"alice", "bob"} {
		_, err := st.AddUser(ctx, name)
		must(err)
	}
	_, err := st.AddUser(ctx, "alice")
	say("second alice: ErrExists=%v", errors.Is(err, ErrExists))
	users, err := st.ListUsers(ctx)
	must(err)
	var names []string
	for _, u := range users {
		names = append(names, u.Name)
	}
	say("users %v", names)
	must(st.AddKey(ctx, "alice", Key{Fingerprint: "SHA256:a", PublicKey: "ssh-ed25519 AAAA a", Comment: "laptop"}))
	err = st.AddKey(ctx, "bob", Key{Fingerprint: "SHA256:a", PublicKey: "ssh-ed25519 AAAA a"})
	say("key taken: ErrExists=%v", errors.Is(err, ErrExists))
	owner, err := st.KeyOwner(ctx, "SHA256:a")
	say("key owner %s %v", owner, err)
	expires := time.Unix(2000000000, 0)
	must(st.AddToken(ctx, "alice", "tok1", []byte{0, 1, 2, 255}, expires, ""))
	must(st.AddToken(ctx, "bob", "tok2", []byte{9}, time.Time{}, ScopeMetrics))
	must(st.RevokeToken(ctx, "tok2"))
	tok, err := st.GetToken(ctx, "tok1")
	must(err)
	say("token %s %s %x expires=%d revoked=%v", tok.ID, tok.User, tok.Hash, tok.Expires.Unix(), !tok.Revoked.IsZero())
	toks, err := st.Tokens(ctx)
	must(err)
	for _, tk := range toks {
		say("tokens: %s %s scope=%q revoked=%v", tk.ID, tk.User, tk.Scope, !tk.Revoked.IsZero())
	}
	must(st.SetGrant(ctx, Grant{User: "alice", RepoPattern: "team/*", Role: "read"}))
	must(st.SetGrant(ctx, Grant{User: "alice", RepoPattern: "team/*", Role: "write"})) // upsert
	must(st.SetGrant(ctx, Grant{User: "bob", RepoPattern: "**", Role: "admin"}))
	must(st.RemoveGrant(ctx, "bob", "**"))
	grants, err := st.Grants(ctx, "")
	must(err)
	say("grants %+v", grants)
	must(st.SetSetting(ctx, "anonymous-read", "off"))
	must(st.SetSetting(ctx, "anonymous-read", "on"))
	v, err := st.Setting(ctx, "anonymous-read", "?")
	must(err)
	d, err := st.Setting(ctx, "missing", "default")
	must(err)
	say("settings %s %s", v, d)
	must(st.SetAnonRead(ctx, AnonRead{RepoPattern: "secret/**", Enabled: false}))
	must(st.SetAnonRead(ctx, AnonRead{RepoPattern: "pub/*", Enabled: true}))
	anon, err := st.AnonReads(ctx)
	must(err)
	say("anon %+v", anon)
	_, err = st.InsertRules(ctx, 1, Rule{Allow: true, Ops: "push", RepoPattern: "**", RefPattern: "refs/**", Who: "*"})
	must(err)
	_, err = st.InsertRules(ctx, 1, Rule{Allow: false, Ops: "delete", RepoPattern: "team/*", RefPattern: "refs/heads/main", Who: "role:write"},
		Rule{Allow: false, Ops: "force-push", RepoPattern: "team/*", RefPattern: "refs/heads/main", Who: "*"})
	must(err)
	removed, err := st.RemoveRule(ctx, 2)
	must(err)
	say("removed rule %+v", removed)
	rules, err := st.Rules(ctx)
	must(err)
	for _, r := range rules {
		verb := "deny"
		if r.Allow {
			verb = "allow"
		}
		say("rule %d: %s %s %s %s %s", r.Position, verb, r.Ops, r.RepoPattern, r.RefPattern, r.Who)
	}
	// A model without bob is refused unless pruned, then applied whole.
	model := Model{AnonReadDefault: "off", Users: []User{{Name: "alice"}, {Name: "carol"}},
		Keys:      []Key{{Fingerprint: "SHA256:c", User: "carol", PublicKey: "ssh-ed25519 AAAA c"}},
		Grants:    []Grant{{User: "carol", RepoPattern: "x/*", Role: "read"}},
		Rules:     []Rule{{Allow: true, Ops: "all", RepoPattern: "**", RefPattern: "refs/**", Who: "carol"}},
		AnonReads: []AnonRead{{RepoPattern: "open/**", Enabled: true}}}
	var ure *UsersRemovedError
	err = st.ReplaceModel(ctx, model, false)
	if errors.As(err, &ure) {
		say("UsersRemovedError %v", ure.Users)
	} else {
		say("replace without prune: %v", err)
	}
	must(st.ReplaceModel(ctx, model, true))
	users, _ = st.ListUsers(ctx)
	names = nil
	for _, u := range users {
		names = append(names, u.Name)
	}
	keys, _ := st.Keys(ctx, "")
	grants, _ = st.Grants(ctx, "")
	rules, _ = st.Rules(ctx)
	anon, _ = st.AnonReads(ctx)
	toks, _ = st.Tokens(ctx)
	say("after import: users %v, %d keys (%s of %s), grants %+v, %d rules, anon %+v, %d tokens", names, len(keys), keys[0].Fingerprint, keys[0].User, grants, len(rules), anon, len(toks))
	must(st.RemoveUser(ctx, "carol"))
	_, err = st.GetUser(ctx, "carol")
	say("carol removed: ErrNotFound=%v", errors.Is(err, ErrNotFound))

	// Hooks and the outbox.
	id, err := st.AddHook(ctx, Hook{RepoPattern: "team/*", URL: "https://u:p@ci.example/h?t=x", Secret: "s", Events: []string{"push"}})
	must(err)
	h, err := st.GetHook(ctx, id)
	must(err)
	say("hook %d %s %s %v", h.ID, h.RepoPattern, h.URL, h.Events)
	must(st.EnqueueDeliveries(ctx, []NewDelivery{
		{Kind: KindWebhook, Target: fmt.Sprint(id), Repo: "team/app", Event: "push", Payload: []byte(`{"a":1}`)},
		{Kind: KindWebhook, Target: fmt.Sprint(id), Repo: "team/app", Event: "push", Payload: []byte(`{"a":2}`)},
		{Kind: KindPushMirror, Target: "team/app#1", Repo: "team/app", Event: "push", Payload: []byte(`{}`)},
	}))
	due, err := st.DueDeliveries(ctx, time.Now().Add(time.Second), 10)
	must(err)
	say("due %d", len(due))
	for _, dv := range due {
		say("  %s %s %s %s %s", dv.Kind, dv.Target, dv.Repo, dv.Event, dv.Payload)
	}
	first := due[0]
	must(st.RecordAttempt(ctx, first, Attempt{Number: 1, Start: time.Now(), Latency: 3 * time.Millisecond, Status: 500, Error: "HTTP 500"},
		Outcome{State: DeliveryPending, Next: time.Now().Add(time.Hour)}))
	must(st.RecordAttempt(ctx, first, Attempt{Number: 2, Start: time.Now(), Latency: 2 * time.Millisecond, Status: 200},
		Outcome{State: DeliveryDelivered}))
	got, err := st.GetDelivery(ctx, first.ID)
	must(err)
	as, err := st.Attempts(ctx, first.ID)
	must(err)
	say("delivery: %s after %d attempts, last %d; attempts %d, first status %d %q latency %s", got.State, got.Attempts, got.LastStatus, len(as), as[0].Status, as[0].Error, as[0].Latency)
	last, err := st.LastPendingID(ctx, KindWebhook, fmt.Sprint(id))
	must(err)
	n, err := st.CoverDeliveries(ctx, KindWebhook, fmt.Sprint(id), last, first.ID)
	must(err)
	say("covered %d", n)
	must(st.AbandonDeliveries(ctx, KindPushMirror, "team/app#1", "removed"))
	all, err := st.Deliveries(ctx, DeliveryFilter{Limit: 10})
	must(err)
	for _, dv := range all {
		say("  delivery %s %s %s %q", dv.Kind, dv.Event, dv.State, dv.LastError)
	}
	trimmed, err := st.TrimDeliveries(ctx, time.Now().Add(time.Hour))
	must(err)
	say("trimmed %d", trimmed)
	must(st.RemoveHook(ctx, id))
	hooks, _ := st.Hooks(ctx)
	say("hooks left %d", len(hooks))

	must(st.RecordAudit(ctx, "repo create", "team/app", "HEAD -> refs/heads/main"))
	entries, err := st.Audit(ctx, 0)
	must(err)
	for _, e := range entries {
		say("audit %s %s %s %q", e.Actor, e.Action, e.Target, e.Detail)
	}
	return b.String()
}

// TestPostgresMigrationsOnce: nodes starting together on a new database
// each apply the schema at most once (an advisory lock), and all open it.
func TestPostgresMigrationsOnce(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Shared(t).NewDatabase(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := OpenPostgres(ctx, url)
			if err == nil {
				st.Close()
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	st, err := OpenPostgres(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var version int
	if err := st.DB.QueryRow("SELECT version FROM schema_version").Scan(&version); err != nil || version != len(migrations) {
		t.Fatalf("schema version %d (%v), want %d", version, err, len(migrations))
	}
}

func TestRebind(t *testing.T) {
	got := Postgres.rebind("SELECT a FROM t WHERE b = ? AND c = '?' AND d IN (?, ?)")
	if want := "SELECT a FROM t WHERE b = $1 AND c = '?' AND d IN ($2, $3)"; got != want {
		t.Fatalf("rebind: %s", got)
	}
	if q := "SELECT ?"; SQLite.rebind(q) != q {
		t.Fatal("SQLite queries are unchanged")
	}
}
