package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"packwire/internal/access"
	"packwire/internal/datadir"
	"packwire/internal/store"
)

// openData parses an admin command's flags (always --data, plus any that
// extra registers) and opens the data directory.
func openData(ctx context.Context, name, synopsis, description string, args []string, stderr io.Writer, extra func(*flag.FlagSet)) (*datadir.Data, []string, error) {
	fs := newFlagSet(name, synopsis, description, stderr)
	dir := fs.String("data", datadir.DefaultDir, "data directory")
	if extra != nil {
		extra(fs)
	}
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return nil, nil, err
	}
	data, err := datadir.Open(ctx, *dir)
	if err != nil {
		return nil, nil, err
	}
	return data, pos, nil
}

func cmdRepo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usagef("usage: packwire repo create NAME | repo import NAME SOURCE [--mirror] | repo list | repo show NAME | repo set-head NAME BRANCH | repo quota NAME [SIZE|off] | repo sync NAME | repo mirror add|list|remove")
	}
	sub, args := args[0], args[1:]
	switch sub {
	case "create":
		var branch string
		data, pos, err := openData(ctx, "repo create", "repo create NAME [--default-branch BRANCH] [--data DIR]", "Create an empty bare repository. Names may be nested (team/app). Its HEAD names\nthe server's default branch (see packwire default-branch; main unless set).", args, stderr,
			func(fs *flag.FlagSet) {
				fs.StringVar(&branch, "default-branch", "", "the branch HEAD names (default: the server's default branch)")
			})
		if err != nil {
			return err
		}
		defer data.Close()
		if len(pos) != 1 {
			return usagef("usage: packwire repo create NAME")
		}
		if branch != "" {
			data.Repos.DefaultBranch = branch
		}
		r, err := data.Repos.Create(ctx, pos[0])
		if err != nil {
			return fmt.Errorf("repo create %s: %w", pos[0], err)
		}
		fmt.Fprintf(stdout, "created %s at %s\n", r.Name, r.Path)
		publishRepoCreated(ctx, data, r, "", false, stderr)
	case "import":
		return cmdRepoImport(ctx, args, stdout, stderr)
	case "list":
		data, _, err := openData(ctx, "repo list", "repo list [--data DIR]", "List repositories.", args, stderr, nil)
		if err != nil {
			return err
		}
		defer data.Close()
		repos, err := data.Repos.List()
		if err != nil {
			return err
		}
		for _, r := range repos {
			fmt.Fprintln(stdout, r.Name)
		}
	case "show":
		return cmdRepoShow(ctx, args, stdout, stderr)
	case "set-head":
		return cmdRepoSetHead(ctx, args, stdout, stderr)
	case "quota":
		return cmdRepoQuota(ctx, args, stdout, stderr)
	case "sync":
		return cmdRepoSync(ctx, args, stdout, stderr)
	case "mirror":
		return cmdRepoMirror(ctx, args, stdout, stderr)
	default:
		return usagef("unknown repo command %q", sub)
	}
	return nil
}

func cmdUser(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usagef("usage: packwire user add NAME [--key FILE]... | user list | user remove NAME")
	}
	sub, args := args[0], args[1:]
	switch sub {
	case "add":
		var keys stringList
		data, pos, err := openData(ctx, "user add", "user add NAME [--key PUBKEY_FILE]... [--data DIR]", "Register a user, optionally with SSH public keys (authorized_keys format).", args, stderr,
			func(fs *flag.FlagSet) { fs.Var(&keys, "key", "SSH public key file (repeatable)") })
		if err != nil {
			return err
		}
		defer data.Close()
		if len(pos) != 1 || !access.ValidUserName(pos[0]) {
			return usagef("usage: packwire user add NAME (letters, digits, '.', '_', '-')")
		}
		// Parse every key before writing anything, so a bad file adds nothing.
		parsed := make([]store.Key, 0, len(keys))
		for _, f := range keys {
			k, err := readKeyFile(f)
			if err != nil {
				return err
			}
			parsed = append(parsed, k)
		}
		if _, err := data.Store.AddUser(ctx, pos[0]); err != nil {
			return fmt.Errorf("user add %s: %w", pos[0], err)
		}
		for _, k := range parsed {
			if err := data.Store.AddKey(ctx, pos[0], k); err != nil {
				return fmt.Errorf("key %s: %w", k.Fingerprint, err)
			}
			fmt.Fprintf(stdout, "key %s added\n", k.Fingerprint)
		}
		fmt.Fprintf(stdout, "user %s added\n", pos[0])
	case "list":
		data, _, err := openData(ctx, "user list", "user list [--data DIR]", "List users.", args, stderr, nil)
		if err != nil {
			return err
		}
		defer data.Close()
		users, err := data.Store.ListUsers(ctx)
		if err != nil {
			return err
		}
		for _, u := range users {
			fmt.Fprintln(stdout, u.Name)
		}
	case "remove":
		data, pos, err := openData(ctx, "user remove", "user remove NAME [--data DIR]", "Remove a user with their keys, tokens and grants.", args, stderr, nil)
		if err != nil {
			return err
		}
		defer data.Close()
		if len(pos) != 1 {
			return usagef("usage: packwire user remove NAME")
		}
		if err := data.Store.RemoveUser(ctx, pos[0]); err != nil {
			return fmt.Errorf("user remove %s: %w", pos[0], err)
		}
		fmt.Fprintf(stdout, "user %s removed\n", pos[0])
	default:
		return usagef("unknown user command %q", sub)
	}
	return nil
}

func cmdKey(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "remove" {
		return cmdKeyRemove(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "list" {
		return cmdKeyList(ctx, args[1:], stdout, stderr)
	}
	if len(args) == 0 || args[0] != "add" {
		return usagef("usage: packwire key add USER PUBKEY_FILE | key remove FINGERPRINT|PUBKEY_FILE | key list [USER]")
	}
	data, pos, err := openData(ctx, "key add", "key add USER PUBKEY_FILE [--data DIR]", "Add an SSH public key to a user.", args[1:], stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if len(pos) != 2 {
		return usagef("usage: packwire key add USER PUBKEY_FILE")
	}
	k, err := readKeyFile(pos[1])
	if err != nil {
		return err
	}
	if err := data.Store.AddKey(ctx, pos[0], k); err != nil {
		return fmt.Errorf("key add: %w", err)
	}
	fmt.Fprintf(stdout, "key %s added to %s\n", k.Fingerprint, pos[0])
	return nil
}

func cmdToken(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "revoke" {
		return cmdTokenRevoke(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "list" {
		return cmdTokenList(ctx, args[1:], stdout, stderr)
	}
	if len(args) == 0 || args[0] != "create" {
		return usagef("usage: packwire token create USER [--expires DURATION] | token revoke ID | token list [USER]")
	}
	var ttl time.Duration
	data, pos, err := openData(ctx, "token create", "token create USER [--expires DURATION] [--data DIR]",
		"Create an HTTP token for USER. It is printed once, alone on the last line of\nstdout; only its hash is stored. Use it as the password of HTTP Basic auth.", args[1:], stderr,
		func(fs *flag.FlagSet) {
			fs.DurationVar(&ttl, "expires", 0, "token lifetime, e.g. 720h (0: never expires)")
		})
	if err != nil {
		return err
	}
	defer data.Close()
	if len(pos) != 1 {
		return usagef("usage: packwire token create USER")
	}
	token, err := data.Access.CreateToken(ctx, pos[0], ttl)
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("token create: no user %q", pos[0])
	}
	if err != nil {
		return fmt.Errorf("token create: %w", err)
	}
	if ttl > 0 {
		fmt.Fprintf(stdout, "token for %s, expires %s:\n", pos[0], time.Now().Add(ttl).UTC().Format(time.RFC3339))
	} else {
		fmt.Fprintf(stdout, "token for %s (shown once, store it now):\n", pos[0])
	}
	fmt.Fprintln(stdout, token)
	return nil
}

func readKeyFile(path string) (store.Key, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return store.Key{}, err
	}
	pub, comment, _, _, err := ssh.ParseAuthorizedKey(b)
	if err != nil {
		return store.Key{}, fmt.Errorf("%s: not an SSH public key: %w", path, err)
	}
	return store.Key{
		Fingerprint: ssh.FingerprintSHA256(pub),
		PublicKey:   strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub))),
		Comment:     comment,
	}, nil
}
