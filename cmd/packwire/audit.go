package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/user"
	"text/tabwriter"
	"time"

	"packwire/internal/datadir"
	"packwire/internal/store"
)

// cliActor is who the audit log says ran an admin command: the OS user,
// and the one sudo ran it for.
func cliActor() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	if by := os.Getenv("SUDO_USER"); by != "" && by != name {
		name += " (sudo by " + by + ")"
	}
	return "cli:" + name
}

// recordRepoChange adds a change made on disk (a repository created,
// deleted, renamed...) to the audit log; the change is done by then, so a
// failure to record it is reported, not undone.
func recordRepoChange(ctx context.Context, data *datadir.Data, stderr io.Writer, action, target, detail string) {
	if err := data.Store.RecordAudit(ctx, action, target, detail); err != nil {
		fmt.Fprintf(stderr, "packwire: %s %s done, but not recorded in the audit log: %v\n", action, target, err)
	}
}

func cmdAudit(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "audit [--limit N] [--json] [--data DIR]"
	var limit int
	var asJSON bool
	data, pos, err := openData(ctx, "audit", syn,
		"Show the audit log, newest first: every change to users, keys, tokens, grants,\nref rules, settings, repositories and hooks, with who made it (cli:USER, the\nOS user of an admin command; dashboard:USER) and when.", args, stderr,
		func(fs *flag.FlagSet) {
			fs.IntVar(&limit, "limit", 50, "show at most this many entries (0: all)")
			fs.BoolVar(&asJSON, "json", false, "print the entries as a JSON array")
		})
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 0, 0, syn); err != nil {
		return err
	}
	entries, err := data.Store.Audit(ctx, limit)
	if err != nil {
		return err
	}
	if asJSON {
		if entries == nil {
			entries = []store.AuditEntry{}
		}
		return writeJSON(stdout, entries)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WHEN\tWHO\tACTION\tTARGET\tDETAIL")
	for _, e := range entries {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", e.At.UTC().Format(time.RFC3339), e.Actor, e.Action, e.Target, e.Detail)
	}
	return tw.Flush()
}

// redactURL drops the password (or token) of a URL's userinfo, for the
// audit log and output: credentials are never written back.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

// cmdUserShow shows one user: keys, tokens (never secrets), grants, and the
// ref rules that name them.
func cmdUserShow(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "user show NAME [--data DIR]"
	data, pos, err := openData(ctx, "user show", syn, "Show a user's SSH keys (fingerprints), HTTP tokens (ids, never secrets),\ngrants, and the ref rules that name them.", args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 1, 1, syn); err != nil {
		return err
	}
	name := pos[0]
	u, err := data.Store.GetUser(ctx, name)
	if err != nil {
		return fmt.Errorf("user show: no user %q", name)
	}
	fmt.Fprintf(stdout, "user %s (since %s)\n", u.Name, u.Created.UTC().Format(time.RFC3339))
	keys, err := data.Store.Keys(ctx, name)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "keys: %d\n", len(keys))
	for _, k := range keys {
		fmt.Fprintf(stdout, "  %s %s\n", k.Fingerprint, k.Comment)
	}
	tokens, err := data.Store.Tokens(ctx)
	if err != nil {
		return err
	}
	var mine []store.Token
	for _, t := range tokens {
		if t.User == name {
			mine = append(mine, t)
		}
	}
	fmt.Fprintf(stdout, "tokens: %d\n", len(mine))
	for _, t := range mine {
		state := "active"
		switch {
		case !t.Revoked.IsZero():
			state = "revoked " + t.Revoked.UTC().Format(time.RFC3339)
		case !t.Expires.IsZero() && time.Now().After(t.Expires):
			state = "expired " + t.Expires.UTC().Format(time.RFC3339)
		case !t.Expires.IsZero():
			state = "expires " + t.Expires.UTC().Format(time.RFC3339)
		}
		scope := t.Scope
		if scope == "" {
			scope = "all"
		}
		fmt.Fprintf(stdout, "  %s scope %s, %s\n", t.ID, scope, state)
	}
	grants, err := data.Store.Grants(ctx, name)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "grants: %d\n", len(grants))
	for _, g := range grants {
		fmt.Fprintf(stdout, "  %s on %s\n", g.Role, g.RepoPattern)
	}
	rules, err := data.Store.Rules(ctx)
	if err != nil {
		return err
	}
	for _, r := range rules {
		if r.Who == name {
			fmt.Fprintf(stdout, "rule #%d: %s\n", r.Position, store.RuleText(r))
		}
	}
	return nil
}
