// Command packwire is a Git server for git://, smart HTTP and SSH in one
// binary. This file only wires the command line to the internal packages.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"packwire/internal/buildinfo"
	"packwire/internal/datadir"
	"packwire/internal/store"
)

// command is one entry of the command line. A leaf has run; a group has
// subs, and "packwire GROUP SUB ..." runs the sub. Adding a command or a
// subcommand is adding an entry here: the overview, "packwire GROUP
// --help" and the test that walks every command's --help derive from this
// table.
type command struct {
	name    string // as typed
	args    string // what follows the name in the overview: "NAME [--key F]..."
	summary string // the overview's line (may hold "\n" for more lines)
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
	subs    []*command
}

// commands is the command line, in the order the overview lists it.
var commands []*command

func init() {
	commands = []*command{
		{name: "serve", args: "[--config FILE]", summary: "serve every bare repository under DATA/repos (creates DATA on first start)", run: cmdServe},
		{name: "upgrade", args: "[--data DIR]", summary: "restart the running server on its sockets, refusing and cutting nothing (a new binary, or settings)", run: cmdUpgrade},
		{name: "init", summary: "create the data directory and its store without serving", run: cmdInit},
		{name: "repo", summary: "repositories", subs: []*command{
			{name: "create", args: "NAME [--default-branch B]", summary: "create an empty bare repository (names may be nested: team/app)", run: cmdRepoCreate},
			{name: "import", args: "NAME SOURCE", summary: "create a repository as a copy of a local path or URL, maintained at once\n(--mirror: a read-only mirror the server keeps in sync, --interval D)", run: cmdRepoImport},
			{name: "sync", args: "NAME", summary: "sync a read-only mirror with its upstream now", run: cmdRepoSync},
			{name: "mirror", summary: "push mirrors: every acknowledged push sent on to another server", subs: []*command{
				{name: "add", args: "NAME URL", summary: "send every push of NAME on to URL (git push --mirror, queued and retried)", run: cmdRepoMirrorAdd},
				{name: "list", args: "NAME", summary: "the upstream NAME mirrors and its push mirrors, with their last sync or delivery", run: cmdRepoMirrorList},
				{name: "remove", args: "NAME ID", summary: "remove a push mirror and its credentials", run: cmdRepoMirrorRemove},
			}},
			{name: "list", summary: "list repositories", run: cmdRepoList},
			{name: "show", args: "NAME", summary: "object layout: packs, preferred pack and what it covers, bitmap, checkout, last run", run: cmdRepoShow},
			{name: "set-head", args: "NAME BRANCH", summary: "make BRANCH the default branch (what HEAD names, what clones check out)", run: cmdRepoSetHead},
			{name: "quota", args: "NAME [SIZE|off]", summary: "show the size on disk and quota, or set the quota (500M, 2G)", run: cmdRepoQuota},
			{name: "delete", args: "NAME", summary: "move a repository into the trash (restorable for --trash-retention, 7 days)", run: cmdRepoDelete},
			{name: "restore", args: "NAME [--at TIMESTAMP]", summary: "bring a deleted repository back (--at: one of several deleted versions)", run: cmdRepoRestore},
			{name: "trash", summary: "list deleted repositories", run: cmdRepoTrash},
			{name: "rename", args: "OLD NEW", summary: "rename a repository; lists the grants and rules that no longer match", run: cmdRepoRename},
			{name: "set-description", args: "NAME TEXT", summary: "the repository's description (git's description file)", run: cmdRepoSetDescription},
		}},
		{name: "default-branch", args: "[BRANCH]", summary: "the branch new repositories' HEAD names (main)", run: cmdDefaultBranch},
		{name: "backup", args: "OUT", summary: "a consistent snapshot of the data directory while the server runs (store, host keys, repositories)", run: cmdBackup},
		{name: "restore", args: "BACKUP --data NEW", summary: "rebuild a data directory from a backup", run: cmdRestore},
		{name: "maintain", args: "[REPO...]", summary: "bring repositories into the layout that serves clones fastest (serve does it in the background)", run: cmdMaintain},
		{name: "user", summary: "users", subs: []*command{
			{name: "add", args: "NAME [--key F]...", summary: "register a user, with SSH public keys", run: cmdUserAdd},
			{name: "list", summary: "list users", run: cmdUserList},
			{name: "show", args: "NAME", summary: "a user's keys, tokens (ids, never secrets), grants and the rules that name them", run: cmdUserShow},
			{name: "remove", args: "NAME", summary: "remove a user with their keys, tokens and grants", run: cmdUserRemove},
		}},
		{name: "key", summary: "SSH keys", subs: []*command{
			{name: "add", args: "USER FILE", summary: "add an SSH public key to a user", run: cmdKeyAdd},
			{name: "remove", args: "FP|FILE", summary: "remove a key by SHA256 fingerprint or public key file", run: cmdKeyRemove},
			{name: "list", args: "[USER]", summary: "list keys with their fingerprints", run: cmdKeyList},
		}},
		{name: "token", summary: "HTTP tokens", subs: []*command{
			{name: "create", args: "USER", summary: "create an HTTP token; printed once, alone on the last line", run: cmdTokenCreate},
			{name: "revoke", args: "ID", summary: "revoke a token (it stays listed)", run: cmdTokenRevoke},
			{name: "list", args: "[USER]", summary: "list tokens: id, user, created, expiry, revoked (never secrets)", run: cmdTokenList},
		}},
		{name: "grant", args: "USER ROLE PATTERN", summary: "give USER read, write or admin on repos PATTERN matches\n('*' within a path segment, '**' any depth: team/*, **)", run: cmdGrant},
		{name: "revoke", args: "USER PATTERN", summary: "remove USER's grant on PATTERN", run: cmdRevoke},
		{name: "grants", args: "[USER]", summary: "list grants", run: cmdGrants},
		{name: "anonymous-read", args: "on|off [PATTERN]", summary: "anonymous read server-wide (default on) or per pattern", run: cmdAnonRead},
		{name: "protect", args: "REPO_PAT REF_PAT", summary: "no force-push, no delete below admin (e.g. refs/heads/main)", run: cmdProtect},
		{name: "rule", summary: "ref rules", subs: []*command{
			{name: "add", args: "[--at N] allow|deny OPS REPO_PAT REF_PAT WHO", summary: "ordered ref rule; first match decides (OPS: create,\npush, force-push, delete, all; WHO: user, role:R, *)", run: cmdRuleAdd},
			{name: "list", summary: "show the ref rules in evaluation order", run: cmdRuleList},
			{name: "remove", args: "N", summary: "remove the rule at position N", run: cmdRuleRemove},
		}},
		{name: "access", summary: "the whole access model as a file", subs: []*command{
			{name: "export", args: "[-o FILE]", summary: "write users, keys, grants, rules, settings as TOML", run: cmdAccessExport},
			{name: "import", args: "FILE [--dry-run] [--prune]", summary: "replace the access model with a TOML file's (--dry-run: show the changes)", run: cmdAccessImport},
		}},
		{name: "hook", summary: "webhooks", subs: []*command{
			{name: "add", args: "REPO_PAT URL", summary: "POST a JSON payload to URL on push, ref-delete, repo-create (--secret S signs it)", run: cmdHookAdd},
			{name: "list", summary: "list webhooks (never their secrets)", run: cmdHookList},
			{name: "remove", args: "ID", summary: "remove a webhook", run: cmdHookRemove},
			{name: "deliveries", args: "[ID]", summary: "the newest deliveries: state, attempts, last status and latency", run: cmdHookDeliveries},
		}},
		{name: "cluster", summary: "nodes sharing a PostgreSQL store", subs: []*command{
			{name: "status", args: "[--json]", summary: "nodes (healthy, last heartbeat) and each repository's primary, replicas, generations", run: cmdClusterStatus},
			{name: "verify", args: "[REPO...]", summary: "compare replicas' refs with their primary's; repair those that differ", run: cmdClusterVerify},
			{name: "move", args: "REPO FROM TO", summary: "move a repository's copy from node FROM to node TO (the new copy caught up first)", run: cmdClusterMove},
			{name: "evacuate", args: "NODE", summary: "move every copy NODE holds to other nodes: replace a lost node, or empty one", run: cmdClusterEvacuate},
		}},
		{name: "audit", args: "[--limit N] [--json]", summary: "every change to users, keys, tokens, grants, rules, settings, repositories: who, what, when", run: cmdAudit},
		{name: "governor", summary: "what requests cost: by kind, repo, user, transport, node (--last N, tail, maintenance; a cluster's with --database)", run: cmdGovernor},
		{name: "netem", args: "--upstream HOST:PORT", summary: "a proxy that adds latency, jitter, a bandwidth limit or resets; counts round trips", run: cmdNetem},
		{name: "rtt", args: "URL...", summary: "round trips and wall of ls-remote, no-op fetch, clone at several added RTTs\n(protocol v0/v2, SSH with/without ControlMaster)", run: cmdRTT},
		{name: "compare", args: "-- CMD_A -- CMD_B", summary: "paired, order-shuffled timing of two commands: median ratio, 95% CI, verdict", run: cmdCompare},
		{name: "advise", args: "URL...", summary: "measure a repository's transports and clone options; recommendations with evidence", run: cmdAdvise},
		{name: "bench", args: "--url URL | --demo", summary: "replay the clone/fetch study (T1-T10) against a server: tables + report.html", run: cmdBench},
		{name: "synth", args: "--shape S --out DIR", summary: "make a repository shaped like the clone study's jquery, swift or linux (--scale F,\n--pull-refs N: unfetched refs/pull/*/head as hosted repositories have)", run: cmdSynth},
		{name: "sizer", args: "REPO [--json]", summary: "repository measures as git-sizer reports them, with a level of concern", run: cmdSizer},
		{name: "version", summary: "print the version, VCS revision and Go version of this build", run: cmdVersion},
		{name: "docs", summary: "this command line's documentation, generated from the command table and --help", subs: []*command{
			{name: "reference", summary: "every command and flag as Markdown (docs/reference.md)", run: cmdDocsReference},
			{name: "man", summary: "the manual page packwire(1) in troff: packwire docs man > packwire.1", run: cmdDocsMan},
		}},
	}
}

const usageHead = `packwire: a Git server for git://, smart HTTP and SSH, on one request pipeline

usage: packwire COMMAND [ARGS] [FLAGS]

commands:
`

const usageTail = `
The commands from serve to governor take --data DIR (default
$PACKWIRE_DATA, else ./packwire-data); only serve and init create it, the
others need it to exist and are safe to run while the server runs. The
lab's commands (netem to sizer) work on URLs and directories and take
none. "packwire COMMAND --help" (or "packwire help COMMAND") shows a
command's flags.
`

// overview is the top-level usage: every command and subcommand of the table.
func overview() string {
	var b strings.Builder
	b.WriteString(usageHead)
	for _, c := range commands {
		writeLeaves(&b, c.name, c)
	}
	b.WriteString(usageTail)
	return b.String()
}

// writeLeaves writes the overview lines of c, named name, or of every
// command below it when c is a group (groups may nest: repo mirror add).
func writeLeaves(b *strings.Builder, name string, c *command) {
	if c.subs == nil {
		writeEntry(b, name, c)
		return
	}
	for _, sub := range c.subs {
		writeLeaves(b, name+" "+sub.name, sub)
	}
}

// writeEntry writes one overview line: name and arguments, then the summary
// from column 30 (on the next line when they are longer).
func writeEntry(b *strings.Builder, name string, c *command) {
	const col = 29
	left := "  " + strings.TrimSpace(name+" "+c.args)
	lines := strings.Split(c.summary, "\n")
	if len(left) < col {
		fmt.Fprintf(b, "%-*s%s\n", col, left, lines[0])
	} else {
		fmt.Fprintf(b, "%s\n%*s%s\n", left, col, "", lines[0])
	}
	for _, l := range lines[1:] {
		fmt.Fprintf(b, "%*s%s\n", col, "", l)
	}
}

// groupUsage lists a group's subcommands, for "packwire GROUP --help" and
// for a group given no or an unknown subcommand; name is the group's full
// name ("repo mirror").
func groupUsage(name string, g *command) string {
	var b strings.Builder
	fmt.Fprintf(&b, "usage: packwire %s SUBCOMMAND [ARGS] [FLAGS]\n\n%s:\n", name, g.summary)
	writeLeaves(&b, name, g)
	fmt.Fprintf(&b, "\n\"packwire %s SUBCOMMAND --help\" shows a subcommand's flags.\n", name)
	return b.String()
}

func lookup(list []*command, name string) *command {
	for _, c := range list {
		if c.name == name {
			return c
		}
	}
	return nil
}

func isHelp(arg string) bool { return arg == "-h" || arg == "-help" || arg == "--help" }

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run executes one command and returns the process exit code: 0, 1 for a
// failure, 2 for a command line packwire did not understand.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	ctx = store.WithActor(ctx, cliActor())
	if len(args) == 0 {
		fmt.Fprint(stderr, overview())
		return 2
	}
	switch {
	case isHelp(args[0]):
		fmt.Fprint(stdout, overview())
		return 0
	case args[0] == "--version":
		args = []string{"version"}
	case args[0] == "help":
		if len(args) == 1 {
			fmt.Fprint(stdout, overview())
			return 0
		}
		args = append(args[1:len(args):len(args)], "--help") // "help repo create" is "repo create --help"
	}
	return exitCode(dispatch(ctx, args, stdout, stderr), stdout, stderr)
}

// dispatch finds the command args name and runs it.
func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := lookup(commands, args[0])
	if c == nil {
		return usageError{fmt.Sprintf("unknown command %q\n\n%s", args[0], overview())}
	}
	return dispatchIn(ctx, c.name, c, args[1:], stdout, stderr)
}

// dispatchIn runs c, named name, with the arguments after its name: a
// leaf runs, a group picks its subcommand from args.
func dispatchIn(ctx context.Context, name string, c *command, args []string, stdout, stderr io.Writer) error {
	if c.subs == nil {
		return c.run(ctx, args, stdout, stderr)
	}
	if len(args) == 0 {
		return usageError{fmt.Sprintf("%s needs a subcommand\n\n%s", name, groupUsage(name, c))}
	}
	if isHelp(args[0]) {
		return helpText{groupUsage(name, c)}
	}
	sub := lookup(c.subs, args[0])
	if sub == nil {
		return usageError{fmt.Sprintf("unknown %s command %q\n\n%s", name, args[0], groupUsage(name, c))}
	}
	return dispatchIn(ctx, name+" "+sub.name, sub, args[1:], stdout, stderr)
}

// exitCode prints what a command returned and maps it to an exit status.
func exitCode(err error, stdout, stderr io.Writer) int {
	var help helpText
	var ue usageError
	var noData *datadir.NoDataError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &help):
		fmt.Fprint(stdout, help.text)
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "packwire: %s\n", ue.msg)
		return 2
	case errors.As(err, &noData):
		fmt.Fprintf(stderr, "packwire: %s (start packwire serve --data %s first, or pass --data)\n", noData, noData.Dir)
		return 2
	}
	fmt.Fprintf(stderr, "packwire: %v\n", err)
	return 1
}

func cmdVersion(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("version", "version", "Print packwire's module version, the VCS revision and commit time it was built\nfrom, and the Go version; \"(devel)\" for a build that recorded no version.", stderr)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(args, pos, 0, 0, "version"); err != nil {
		return err
	}
	fmt.Fprintln(stdout, buildinfo.Get())
	return nil
}

// usageError is a mistake in the command line (exit status 2).
type usageError struct{ msg string }

func (u usageError) Error() string { return u.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// writeJSON is a command's --json output: one indented document.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
