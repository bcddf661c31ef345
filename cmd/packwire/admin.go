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
	"packwire/internal/repo"
	"packwire/internal/server/cluster"
	"packwire/internal/store"
)

// openData parses an admin command's flags (always --data, plus any that
// extra registers) and opens the data directory.
func openData(ctx context.Context, name, synopsis, description string, args []string, stderr io.Writer, extra func(*flag.FlagSet)) (*datadir.Data, []string, error) {
	fs := newFlagSet(name, synopsis, description, stderr)
	dir := dataFlag(fs)
	database := databaseFlag(fs)
	if extra != nil {
		extra(fs)
	}
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return nil, nil, err
	}
	if err := checkOwner(*dir); err != nil {
		return nil, nil, err
	}
	data, err := datadir.OpenWith(ctx, *dir, *database)
	if err != nil {
		return nil, nil, err
	}
	return data, pos, nil
}

func cmdRepoCreate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "repo create NAME [--default-branch BRANCH] [--replicas N] [--data DIR]"
	var branch string
	var replicas int
	data, pos, err := openData(ctx, "repo create", syn, "Create an empty bare repository. Names may be nested (team/app). Its HEAD names\nthe server's default branch (see packwire default-branch; main unless set).", args, stderr,
		func(fs *flag.FlagSet) {
			fs.StringVar(&branch, "default-branch", "", "the branch HEAD names (default: the server's default branch)")
			fs.IntVar(&replicas, "replicas", 0, "in a cluster (--database with nodes): how many nodes hold it (default min(3, healthy nodes))")
		})
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 1, 1, syn); err != nil {
		return err
	}
	if branch != "" {
		if err := repo.CheckBranch(branch); err != nil {
			return fmt.Errorf("repo create %s: %w", pos[0], err)
		}
		data.Repos.DefaultBranch = branch
	}
	if placed, err := placeInCluster(ctx, data, pos[0], "", replicas, stdout); placed || err != nil {
		if err != nil {
			return fmt.Errorf("repo create %s: %w", pos[0], err)
		}
		if branch != "" {
			// Each node creates its copy with the server's default branch;
			// this one is applied to every copy as repo set-head is.
			name, _ := repo.CleanName(pos[0])
			if _, err := cluster.SetSettings(ctx, data.Store.DB, name, cluster.Change{Head: branch}); err != nil {
				return fmt.Errorf("repo create %s: placed, but its HEAD: %w", pos[0], err)
			}
		}
		recordRepoChange(ctx, data, stderr, "repo create", pos[0], "placed in the cluster")
		return nil
	}
	r, err := data.Repos.Create(ctx, pos[0])
	if err != nil {
		return fmt.Errorf("repo create %s: %w", pos[0], err)
	}
	recordRepoChange(ctx, data, stderr, "repo create", r.Name, "HEAD -> "+repo.Head(r))
	fmt.Fprintf(stdout, "created %s at %s\n", r.Name, r.Path)
	publishRepoCreated(ctx, data, r, "", false, stderr)
	return nil
}

func cmdRepoList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	data, pos, err := openData(ctx, "repo list", "repo list [--data DIR]", "List repositories, with their descriptions where set (deleted ones: repo trash).", args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 0, 0, "repo list [--data DIR]"); err != nil {
		return err
	}
	repos, err := data.Repos.List()
	if err != nil {
		return err
	}
	printRepoList(stdout, repos)
	return nil
}

func cmdUserAdd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var keys stringList
	data, pos, err := openData(ctx, "user add", "user add NAME [--key PUBKEY_FILE]... [--data DIR]", "Register a user, optionally with SSH public keys (authorized_keys format).\nNames: letters, digits, '.', '_', '-', not starting with '.' or '-'.", args, stderr,
		func(fs *flag.FlagSet) { fs.Var(&keys, "key", "SSH public key file (repeatable)") })
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 1, 1, "user add NAME [--key PUBKEY_FILE]... [--data DIR]"); err != nil {
		return err
	}
	if !access.ValidUserName(pos[0]) {
		return usagef("user add: invalid user name %q (letters, digits, '.', '_', '-'; not starting with '.' or '-'; at most 64)", pos[0])
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
		if errors.Is(err, store.ErrExists) {
			return fmt.Errorf("user add: user %q already exists", pos[0])
		}
		return fmt.Errorf("user add %s: %w", pos[0], err)
	}
	for _, k := range parsed {
		if err := data.Store.AddKey(ctx, pos[0], k); err != nil {
			return keyAddError(ctx, data, pos[0], k, err)
		}
		fmt.Fprintf(stdout, "key %s added\n", k.Fingerprint)
	}
	fmt.Fprintf(stdout, "user %s added\n", pos[0])
	return nil
}

func cmdUserList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	data, pos, err := openData(ctx, "user list", "user list [--data DIR]", "List users.", args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 0, 0, "user list [--data DIR]"); err != nil {
		return err
	}
	users, err := data.Store.ListUsers(ctx)
	if err != nil {
		return err
	}
	for _, u := range users {
		fmt.Fprintln(stdout, u.Name)
	}
	return nil
}

func cmdUserRemove(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	data, pos, err := openData(ctx, "user remove", "user remove NAME [--data DIR]", "Remove a user with their keys, tokens and grants.\nA running server refuses the next command of the user's open SSH connections\nand closes them (those with no command running within 2 s).", args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 1, 1, "user remove NAME [--data DIR]"); err != nil {
		return err
	}
	if err := data.Store.RemoveUser(ctx, pos[0]); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("user remove: no user %q", pos[0])
		}
		return fmt.Errorf("user remove %s: %w", pos[0], err)
	}
	fmt.Fprintf(stdout, "user %s removed\n", pos[0])
	return nil
}

func cmdKeyAdd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	data, pos, err := openData(ctx, "key add", "key add USER PUBKEY_FILE [--data DIR]", "Add an SSH public key to a user.", args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 2, 2, "key add USER PUBKEY_FILE [--data DIR]"); err != nil {
		return err
	}
	k, err := readKeyFile(pos[1])
	if err != nil {
		return err
	}
	if err := data.Store.AddKey(ctx, pos[0], k); err != nil {
		return keyAddError(ctx, data, pos[0], k, err)
	}
	fmt.Fprintf(stdout, "key %s added to %s\n", k.Fingerprint, pos[0])
	return nil
}

// keyAddError names what stopped a key from being added: the user, or the
// user who already has the key.
func keyAddError(ctx context.Context, data *datadir.Data, user string, k store.Key, err error) error {
	switch {
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("key add: no user %q", user)
	case errors.Is(err, store.ErrExists):
		owner, _ := data.Store.KeyOwner(ctx, k.Fingerprint)
		return fmt.Errorf("key add: key %s is already %s's (a key identifies one user)", k.Fingerprint, owner)
	}
	return fmt.Errorf("key add %s: %w", k.Fingerprint, err)
}

func cmdTokenCreate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "token create USER [--expires DURATION] [--scope metrics] [--data DIR]"
	var ttl time.Duration
	var scope string
	data, pos, err := openData(ctx, "token create", syn,
		"Create an HTTP token for USER. It is printed once, alone on the last line of\nstdout; only its hash is stored. Use it as the password of HTTP Basic auth.\nWith --scope metrics it is good for /metrics only (a Prometheus server's).", args, stderr,
		func(fs *flag.FlagSet) {
			fs.DurationVar(&ttl, "expires", 0, "token lifetime, e.g. 720h or 30d (0: never expires)")
			fs.StringVar(&scope, "scope", "", "metrics: a token for /metrics only, refused for git (default: whatever USER may)")
		})
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 1, 1, syn); err != nil {
		return err
	}
	if ttl < 0 {
		return usagef("token create: --expires %s: a token's lifetime cannot be negative", ttl)
	}
	if scope != "" && scope != store.ScopeMetrics {
		return usagef("token create: unknown --scope %q (metrics, or none)", scope)
	}
	token, err := data.Access.CreateScopedToken(ctx, pos[0], ttl, scope)
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
		return store.Key{}, fmt.Errorf("public key file: %w", err)
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

// dataFlag registers --data: the data directory, $PACKWIRE_DATA by default.
func dataFlag(fs *flag.FlagSet) *string {
	return fs.String("data", datadir.Dir(), "data directory ($"+datadir.EnvDir+" sets the default)")
}

// databaseFlag is --database: where the store is, when not the SQLite file
// in the data directory.
func databaseFlag(fs *flag.FlagSet) *string {
	return fs.String("database", datadir.Database(), "keep the store and the request records in PostgreSQL (postgres://USER@HOST/DB) instead of the SQLite files in --data ($"+datadir.EnvDatabase+" sets the default)")
}

func cmdInit(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "init [--data DIR] [--database URL]"
	fs := newFlagSet("init", syn, `Create the data directory and its store, as packwire serve does on its
first start, so that users, grants and repositories can be set up before
the server runs. Admin commands never create one: a mistyped --data is an
error, not a new empty server. Running init on existing data changes
nothing.`, stderr)
	dir := dataFlag(fs)
	database := databaseFlag(fs)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(args, pos, 0, 0, syn); err != nil {
		return err
	}
	if err := checkOwner(*dir); err != nil {
		return err
	}
	existed, err := datadir.Exists(*dir)
	if err != nil {
		return err
	}
	data, err := datadir.CreateWith(ctx, *dir, *database)
	if err != nil {
		return err
	}
	defer data.Close()
	if existed {
		fmt.Fprintf(stdout, "%s already holds packwire data; nothing changed\n", data.Dir)
	} else {
		fmt.Fprintf(stdout, "created packwire data in %s\n", data.Dir)
	}
	return nil
}
