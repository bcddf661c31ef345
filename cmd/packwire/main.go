// Command packwire is a Git server for git://, smart HTTP and SSH in one
// binary. This file only wires the command line to the internal packages.
package main

import (
	"context"
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
  repo import NAME SOURCE    create a repository as a mirror of a local path or URL, maintained at once
  repo list                  list repositories
  repo show NAME             object layout: packs, preferred pack and what it covers, bitmap, last maintenance
  maintain [REPO...]         bring repositories into the layout that serves clones fastest (serve does it in the background)
  user add NAME [--key F]... register a user, with SSH public keys
  user list                  list users
  user remove NAME           remove a user with their keys and tokens
  key add USER FILE          add an SSH public key to a user
  token create USER          create an HTTP token; printed once, alone on the last line
  governor                   what requests cost: by kind, repo, user, transport (--last N, tail)
  version                    print the version

Every command takes --data DIR (default ./packwire-data) and is safe to run
while the server runs. "packwire COMMAND --help" shows a command's flags.
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
	case "maintain":
		err = cmdMaintain(ctx, args[1:], stdout, stderr)
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
