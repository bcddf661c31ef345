package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"packwire/internal/access"
	"packwire/internal/store"
)

// Access model commands. Each opens the store, changes one thing and
// exits; the server reads the store per request, so changes apply at once.

func cmdGrant(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "grant USER ROLE REPO_PATTERN [--data DIR]"
	data, pos, err := openData(ctx, "grant", syn,
		"Give USER the role read, write or admin on the repositories REPO_PATTERN\nmatches ('*' within one path segment, '**' any depth: team/*, **).\nA user's role on a repository is the highest of their matching grants.", args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 3, 3, syn); err != nil {
		return err
	}
	if _, err := access.ParseRole(pos[1]); err != nil {
		return usagef("grant: %v", err)
	}
	if err := access.ValidPattern(pos[2]); err != nil {
		return usagef("grant: %v", err)
	}
	if err := data.Store.SetGrant(ctx, store.Grant{User: pos[0], Role: pos[1], RepoPattern: pos[2]}); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("grant: no user %q", pos[0])
		}
		return fmt.Errorf("grant: %w", err)
	}
	fmt.Fprintf(stdout, "%s has %s on %s\n", pos[0], pos[1], pos[2])
	return nil
}

func cmdRevoke(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "revoke USER REPO_PATTERN [--data DIR]"
	data, pos, err := openData(ctx, "revoke", syn, "Remove USER's grant on exactly REPO_PATTERN (as given to grant).", args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 2, 2, syn); err != nil {
		return err
	}
	if err := data.Store.RemoveGrant(ctx, pos[0], pos[1]); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			if _, uerr := data.Store.GetUser(ctx, pos[0]); errors.Is(uerr, store.ErrNotFound) {
				return fmt.Errorf("revoke: no user %q", pos[0])
			}
			return fmt.Errorf("revoke: %s has no grant on exactly %s (see packwire grants %[1]s)", pos[0], pos[1])
		}
		return fmt.Errorf("revoke: %w", err)
	}
	fmt.Fprintf(stdout, "%s's grant on %s removed\n", pos[0], pos[1])
	return nil
}

func cmdGrants(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "grants [USER] [--data DIR]"
	data, pos, err := openData(ctx, "grants", syn, "List grants (of USER, or of everyone).", args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 0, 1, syn); err != nil {
		return err
	}
	user := ""
	if len(pos) == 1 {
		user = pos[0]
		if _, err := data.Store.GetUser(ctx, user); errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("grants: no user %q", user)
		}
	}
	gs, err := data.Store.Grants(ctx, user)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "USER\tROLE\tREPO_PATTERN")
	for _, g := range gs {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", g.User, g.Role, g.RepoPattern)
	}
	return tw.Flush()
}

func cmdAnonRead(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "anonymous-read [on|off [REPO_PATTERN]] [--data DIR]"
	data, pos, err := openData(ctx, "anonymous-read", syn,
		"Turn anonymous read on or off, server-wide (default on) or for the\nrepositories REPO_PATTERN matches (the most specific matching pattern\nwins over the server-wide switch; on a tie, off wins). With no\nargument, show the settings.", args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if len(pos) == 0 {
		def, err := data.Store.Setting(ctx, access.SettingAnonRead, "on")
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "server-wide: %s\n", def)
		as, err := data.Store.AnonReads(ctx)
		if err != nil {
			return err
		}
		for _, a := range as {
			fmt.Fprintf(stdout, "%s: %s\n", a.RepoPattern, onOff(a.Enabled))
		}
		return nil
	}
	if err := wantArgs(args, pos, 0, 2, syn); err != nil {
		return err
	}
	if pos[0] != "on" && pos[0] != "off" {
		return usagef("anonymous-read: %q is not on or off\nusage: packwire %s", pos[0], syn)
	}
	if len(pos) == 1 {
		if err := data.Store.SetSetting(ctx, access.SettingAnonRead, pos[0]); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "anonymous read %s server-wide\n", pos[0])
		return nil
	}
	if err := access.ValidPattern(pos[1]); err != nil {
		return usagef("anonymous-read: %v", err)
	}
	if err := data.Store.SetAnonRead(ctx, store.AnonRead{RepoPattern: pos[1], Enabled: pos[0] == "on"}); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "anonymous read %s for %s\n", pos[0], pos[1])
	return nil
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func cmdProtect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "protect REPO_PATTERN REF_PATTERN [--data DIR]"
	data, pos, err := openData(ctx, "protect", syn,
		"Forbid force-push and delete of the refs REF_PATTERN matches (e.g.\nrefs/heads/main, refs/tags/**) for everyone below admin. Adds two rules\nat the top of the rule list (see \"packwire rule list\"):\n  allow force-push,delete REPO REF role:admin\n  deny  force-push,delete REPO REF *", args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 2, 2, syn); err != nil {
		return err
	}
	for _, p := range pos {
		if err := access.ValidPattern(p); err != nil {
			return usagef("protect: %v", err)
		}
	}
	ops := string(access.OpForce) + "," + string(access.OpDelete)
	rules := []store.Rule{
		{Allow: true, Ops: ops, RepoPattern: pos[0], RefPattern: pos[1], Who: "role:admin"},
		{Allow: false, Ops: ops, RepoPattern: pos[0], RefPattern: pos[1], Who: "*"},
	}
	at, err := data.Store.InsertRules(ctx, 1, rules...)
	if err != nil {
		return err
	}
	for i, r := range rules {
		fmt.Fprintf(stdout, "rule #%d: %s\n", at+i, access.RuleText(r))
	}
	return nil
}

func cmdRuleAdd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "rule add [--at N] allow|deny OPS REPO_PATTERN REF_PATTERN WHO [--data DIR]"
	var at int
	data, pos, err := openData(ctx, "rule add", syn,
		"Add a ref rule. Rules are evaluated in order; for each ref a push\ncreates, updates or deletes, the first rule matching the repository, the\nref, the pusher and the operation decides. With no match, write role may\ndo everything. OPS: comma separated create, push (fast-forward),\nforce-push, delete, or all. WHO: a user name, role:read|write|admin (that\nrole or higher) or * (everyone).", args, stderr,
		func(fs *flag.FlagSet) { fs.IntVar(&at, "at", 0, "insert at this 1-based position (default: append)") })
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 5, 5, syn); err != nil {
		return err
	}
	r, err := parseRule(pos)
	if err != nil {
		return usagef("rule add: %v", err)
	}
	if err := ruleUserExists(ctx, data.Store, r.Who); err != nil {
		return fmt.Errorf("rule add: %w", err)
	}
	if at < 0 {
		return usagef("rule add: --at %d: positions start at 1", at)
	}
	n, err := data.Store.InsertRules(ctx, at, r)
	if err != nil {
		return fmt.Errorf("rule add: %w", err)
	}
	fmt.Fprintf(stdout, "rule #%d: %s\n", n, access.RuleText(r))
	return nil
}

// ruleUserExists refuses a rule naming a user the store does not have, as
// grant does: a typo would otherwise make a rule that never matches.
func ruleUserExists(ctx context.Context, st *store.Store, who string) error {
	if who == "*" || strings.HasPrefix(who, "role:") {
		return nil
	}
	if _, err := st.GetUser(ctx, who); errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("no user %q (WHO is a user name, role:read|write|admin or *)", who)
	} else if err != nil {
		return err
	}
	return nil
}

func cmdRuleList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	data, pos, err := openData(ctx, "rule list", "rule list [--data DIR]", "List the ref rules in evaluation order.", args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 0, 0, "rule list [--data DIR]"); err != nil {
		return err
	}
	rules, err := data.Store.Rules(ctx)
	if err != nil {
		return err
	}
	for _, r := range rules {
		fmt.Fprintf(stdout, "#%d %s\n", r.Position, access.RuleText(r))
	}
	return nil
}

func cmdRuleRemove(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "rule remove N [--data DIR]"
	data, pos, err := openData(ctx, "rule remove", syn, "Remove the rule at position N (as \"rule list\" shows it).", args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 1, 1, syn); err != nil {
		return err
	}
	n, err := strconv.Atoi(strings.TrimPrefix(pos[0], "#"))
	if err != nil || n < 1 {
		return usagef("rule remove: %q is not a rule position (1, 2, ... as packwire rule list shows)", pos[0])
	}
	r, err := data.Store.RemoveRule(ctx, n)
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("rule remove: no rule #%d", n)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "removed rule #%d: %s\n", n, access.RuleText(r))
	return nil
}

// parseRule parses allow|deny OPS REPO_PATTERN REF_PATTERN WHO.
func parseRule(f []string) (store.Rule, error) {
	var r store.Rule
	switch f[0] {
	case "allow":
		r.Allow = true
	case "deny":
	default:
		return r, fmt.Errorf("rule must start with allow or deny, not %q", f[0])
	}
	ops, err := access.ParseOps(f[1])
	if err != nil {
		return r, err
	}
	r.Ops = ops
	for _, p := range f[2:4] {
		if err := access.ValidPattern(p); err != nil {
			return r, err
		}
	}
	if err := access.ValidWho(f[4]); err != nil {
		return r, err
	}
	r.RepoPattern, r.RefPattern, r.Who = f[2], f[3], f[4]
	return r, nil
}

func cmdKeyRemove(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "key remove FINGERPRINT|PUBKEY_FILE [--data DIR]"
	data, pos, err := openData(ctx, "key remove", syn, "Remove an SSH key, named by its SHA256 fingerprint or by its public key file.\nA running server refuses the next command of every SSH connection open with the\nkey and closes it (one with no command running within 2 s).", args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 1, 1, syn); err != nil {
		return err
	}
	fp := pos[0]
	if !strings.HasPrefix(fp, "SHA256:") {
		if _, err := os.Stat(fp); err != nil {
			return fmt.Errorf("key remove: %q is neither a SHA256: fingerprint nor a readable key file", fp)
		}
		k, err := readKeyFile(fp)
		if err != nil {
			return err
		}
		fp = k.Fingerprint
	}
	owner, err := data.Store.RemoveKey(ctx, fp)
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("key remove: no key %s", fp)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "key %s removed from %s\n", fp, owner)
	return nil
}

func cmdKeyList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	data, pos, err := openData(ctx, "key list", "key list [USER] [--data DIR]", "List SSH keys (of USER, or of everyone).", args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 0, 1, "key list [USER] [--data DIR]"); err != nil {
		return err
	}
	if len(pos) == 1 {
		if _, err := data.Store.GetUser(ctx, pos[0]); errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("key list: no user %q", pos[0])
		}
	}
	keys, err := data.Store.Keys(ctx, strings.Join(pos, ""))
	if err != nil {
		return err
	}
	for _, k := range keys {
		fmt.Fprintf(stdout, "%s %s %s\n", k.User, k.Fingerprint, k.Comment)
	}
	return nil
}

func cmdTokenList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	data, pos, err := openData(ctx, "token list", "token list [USER] [--data DIR]", "List tokens: id, user, created, expiry, revoked. Never secrets.", args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 0, 1, "token list [USER] [--data DIR]"); err != nil {
		return err
	}
	if len(pos) == 1 {
		if _, err := data.Store.GetUser(ctx, pos[0]); errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("token list: no user %q", pos[0])
		}
	}
	ts, err := data.Store.Tokens(ctx)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tUSER\tSCOPE\tCREATED\tEXPIRES\tREVOKED")
	for _, t := range ts {
		if len(pos) == 1 && t.User != pos[0] {
			continue
		}
		scope := t.Scope
		if scope == "" {
			scope = "all"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.User, scope, stamp(t.Created, "-"), stamp(t.Expires, "never"), stamp(t.Revoked, "no"))
	}
	return tw.Flush()
}

func stamp(t time.Time, zero string) string {
	if t.IsZero() {
		return zero
	}
	return t.UTC().Format(time.RFC3339)
}

func cmdTokenRevoke(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "token revoke ID [--data DIR]"
	data, pos, err := openData(ctx, "token revoke", syn, "Revoke a token by its id (as \"token list\" shows it; a whole token works too).\nIt stops working at once and stays listed as revoked.", args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 1, 1, syn); err != nil {
		return err
	}
	id := pos[0]
	if rest, ok := strings.CutPrefix(id, "pwt_"); ok {
		id, _, _ = strings.Cut(rest, "_")
	}
	if err := data.Store.RevokeToken(ctx, id); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("token revoke: no token with id %s (see packwire token list)", id)
		}
		return fmt.Errorf("token revoke: %w", err)
	}
	fmt.Fprintf(stdout, "token %s revoked\n", id)
	return nil
}

func cmdAccessExport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var output string
	data, pos, err := openData(ctx, "access export", "access export [-o FILE] [--data DIR]",
		"Write the whole access model (users, keys, grants, rules, anonymous read\nsettings, token metadata; never token secrets or hashes) as TOML.", args, stderr,
		func(fs *flag.FlagSet) { fs.StringVar(&output, "o", "", "write to FILE instead of stdout") })
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 0, 0, "access export [-o FILE] [--data DIR]"); err != nil {
		return err
	}
	b, err := data.Access.Export(ctx)
	if err != nil {
		return err
	}
	if output == "" {
		_, err = stdout.Write(b)
		return err
	}
	return os.WriteFile(output, b, 0o600)
}

func cmdAccessImport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "access import FILE [--dry-run] [--prune] [--data DIR]"
	var dryRun, prune bool
	data, pos, err := openData(ctx, "access import", syn,
		`Replace users, keys, grants, rules and anonymous read settings with those
of FILE (as written by access export), in one transaction, and list what
changed. Users that stay keep their tokens. Users not in FILE would be
removed with their keys, tokens and grants: the import is refused unless
--prune says to. Unknown keys, grants and rules naming users not in FILE
are errors. --dry-run lists the changes and makes none.`, args, stderr,
		func(fs *flag.FlagSet) {
			fs.BoolVar(&dryRun, "dry-run", false, "list what would change (users, keys, tokens, grants, rules, anonymous read) and change nothing")
			fs.BoolVar(&prune, "prune", false, "remove the users FILE does not list, with their keys, tokens and grants")
		})
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 1, 1, syn); err != nil {
		return err
	}
	b, err := os.ReadFile(pos[0])
	if err != nil {
		return fmt.Errorf("access import: %w", err)
	}
	if dryRun {
		_, changes, err := data.Access.PlanImport(ctx, b)
		if err != nil {
			return fmt.Errorf("access import %s: %w", pos[0], err)
		}
		printChanges(stdout, changes, true)
		if removed := removedUsers(changes); len(removed) > 0 && !prune {
			fmt.Fprintf(stdout, "(users would be removed: the import needs --prune)\n")
		}
		fmt.Fprintln(stdout, "dry run: nothing changed")
		return nil
	}
	m, changes, err := data.Access.Import(ctx, b, prune)
	var refused *store.UsersRemovedError
	if errors.As(err, &refused) {
		tokens := 0
		for _, c := range changes {
			if c.Kind == "token" && c.Op == '-' {
				tokens++
			}
		}
		return fmt.Errorf("access import %s: refused: it would remove users %s (with %s, their keys and grants); pass --prune to remove them, or add them to the file (--dry-run lists every change)",
			pos[0], strings.Join(refused.Users, ", "), plural(tokens, "token"))
	}
	if err != nil {
		return fmt.Errorf("access import %s: %w", pos[0], err)
	}
	printChanges(stdout, changes, false)
	fmt.Fprintf(stdout, "imported %d users, %d keys, %d grants, %d rules\n", len(m.Users), len(m.Keys), len(m.Grants), len(m.Rules))
	return nil
}

// printChanges lists an import's changes, one a line ("+ user carol").
func printChanges(w io.Writer, changes []access.Change, dryRun bool) {
	switch {
	case len(changes) == 0:
		fmt.Fprintln(w, "no changes")
		return
	case dryRun:
		fmt.Fprintf(w, "would make %d changes:\n", len(changes))
	default:
		fmt.Fprintf(w, "%d changes:\n", len(changes))
	}
	for _, c := range changes {
		fmt.Fprintf(w, "  %s\n", c)
	}
}

func removedUsers(changes []access.Change) []string {
	var names []string
	for _, c := range changes {
		if c.Kind == "user" && c.Op == '-' {
			names = append(names, c.Text)
		}
	}
	return names
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
