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
)

const usage = `packwire: a Git server for git://, smart HTTP and SSH, on one request pipeline

usage: packwire COMMAND [ARGS] [FLAGS]

commands:
  serve                      serve every bare repository under DATA/repos
  repo create NAME           create an empty bare repository (names may be nested: team/app)
  repo import NAME SOURCE    create a repository as a copy of a local path or URL, maintained at once
                             (--mirror: a read-only mirror the server keeps in sync, --interval D)
  repo sync NAME             sync a read-only mirror with its upstream now
  repo mirror add NAME URL   send every push on to URL (a push mirror); repo mirror list|remove
  repo list                  list repositories
  repo show NAME             object layout: packs, preferred pack and what it covers, bitmap, checkout, last run
  maintain [REPO...]         bring repositories into the layout that serves clones fastest (serve does it in the background)
  user add NAME [--key F]... register a user, with SSH public keys
  user list                  list users
  user remove NAME           remove a user with their keys, tokens and grants
  key add USER FILE          add an SSH public key to a user
  key remove FP|FILE         remove a key by SHA256 fingerprint or public key file
  key list [USER]            list keys with their fingerprints
  token create USER          create an HTTP token; printed once, alone on the last line
  token revoke ID            revoke a token (it stays listed)
  token list [USER]          list tokens: id, user, created, expiry, revoked (never secrets)
  grant USER ROLE PATTERN    give USER read, write or admin on repos PATTERN matches
                             ('*' within a path segment, '**' any depth: team/*, **)
  revoke USER PATTERN        remove USER's grant on PATTERN
  grants [USER]              list grants
  default-branch [BRANCH]    the branch new repositories' HEAD names (main)
  anonymous-read on|off [PATTERN]
                             anonymous read server-wide (default on) or per pattern
  protect REPO_PAT REF_PAT   no force-push, no delete below admin (e.g. refs/heads/main)
  rule add [--at N] allow|deny OPS REPO_PAT REF_PAT WHO
                             ordered ref rule; first match decides (OPS: create,
                             push, force-push, delete, all; WHO: user, role:R, *)
  rule list                  show the ref rules in evaluation order
  rule remove N              remove the rule at position N
  access export [-o FILE]    write users, keys, grants, rules, settings as TOML
  access import FILE         replace the access model with a TOML file's
  hook add REPO_PAT URL      POST a JSON payload to URL on push, ref-delete, repo-create (--secret S signs it)
  hook list|remove ID|deliveries [ID]
                             webhooks (never their secrets), and each delivery's attempts
  governor                   what requests cost: by kind, repo, user, transport (--last N, tail, maintenance)
  netem --upstream HOST:PORT a proxy that adds latency, jitter, a bandwidth limit or resets; counts round trips
  rtt URL...                 round trips and wall of ls-remote, no-op fetch, clone at several added RTTs
                             (protocol v0/v2, SSH with/without ControlMaster)
  compare -- CMD_A -- CMD_B  paired, order-shuffled timing of two commands: median ratio, 95% CI, verdict
  advise URL...              measure a repository's transports and clone options; recommendations with evidence
  bench --url URL | --demo   replay the clone/fetch study (T1-T10) against a server: tables + report.html
  synth --shape S --out DIR  make a repository shaped like the clone study's jquery, swift or linux (--scale F,
                             --pull-refs N: unfetched refs/pull/*/head as hosted repositories have)
  sizer REPO [--json]        repository measures as git-sizer reports them, with a level of concern
  version                    print the version

The commands from serve to governor take --data DIR (default
./packwire-data) and are safe to run while the server runs; the lab's
commands (netem to sizer) work on URLs and directories and take none. "packwire COMMAND --help" shows a command's flags.
`

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run executes one command and returns the process exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = cmdServe(ctx, args[1:], stdout, stderr)
	case "repo":
		err = cmdRepo(ctx, args[1:], stdout, stderr)
	case "user":
		err = cmdUser(ctx, args[1:], stdout, stderr)
	case "key":
		err = cmdKey(ctx, args[1:], stdout, stderr)
	case "token":
		err = cmdToken(ctx, args[1:], stdout, stderr)
	case "governor":
		err = cmdGovernor(ctx, args[1:], stdout, stderr)
	case "grant":
		err = cmdGrant(ctx, args[1:], stdout, stderr)
	case "revoke":
		err = cmdRevoke(ctx, args[1:], stdout, stderr)
	case "grants":
		err = cmdGrants(ctx, args[1:], stdout, stderr)
	case "default-branch":
		err = cmdDefaultBranch(ctx, args[1:], stdout, stderr)
	case "anonymous-read":
		err = cmdAnonRead(ctx, args[1:], stdout, stderr)
	case "protect":
		err = cmdProtect(ctx, args[1:], stdout, stderr)
	case "rule":
		err = cmdRule(ctx, args[1:], stdout, stderr)
	case "access":
		err = cmdAccess(ctx, args[1:], stdout, stderr)
	case "hook":
		err = cmdHook(ctx, args[1:], stdout, stderr)
	case "maintain":
		err = cmdMaintain(ctx, args[1:], stdout, stderr)
	case "bench":
		err = cmdBench(ctx, args[1:], stdout, stderr)
	case "netem":
		err = cmdNetem(ctx, args[1:], stdout, stderr)
	case "rtt":
		err = cmdRTT(ctx, args[1:], stdout, stderr)
	case "compare":
		err = cmdCompare(ctx, args[1:], stdout, stderr)
	case "advise":
		err = cmdAdvise(ctx, args[1:], stdout, stderr)
	case "synth":
		err = cmdSynth(ctx, args[1:], stdout, stderr)
	case "sizer":
		err = cmdSizer(ctx, args[1:], stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, "packwire", version)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "packwire: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "packwire: %s\n", ue.msg)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "packwire: %v\n", err)
		return 1
	}
	return 0
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
