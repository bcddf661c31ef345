package mirror

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"packwire/internal/repo"
)

// ImportOptions say how Import makes a repository.
type ImportOptions struct {
	Mirror   bool          // keep it a read-only pull mirror of its source
	Interval time.Duration // a pull mirror's sync interval (0: DefaultInterval)
	Token    string        // upstream's token, when the URL carries no credentials
	// Credentials, if not empty, are upstream's (a cluster's primary
	// imports with those its settings keep).
	Credentials Credentials
}

// Import creates a repository from source, authenticating with the
// credentials in its URL or the token without putting them on a command
// line. A pull mirror keeps its remote (the URL without credentials), the
// credentials in its credentials file, and packwire.pullMirror; any other
// import forgets where it came from. It returns the URL fit to print.
func Import(ctx context.Context, root repo.Root, name, source string, o ImportOptions) (repo.Repo, string, error) {
	clean, creds, err := SplitURL(source)
	if err != nil {
		return repo.Repo{}, "", err
	}
	creds = withToken(creds, o.Token)
	if !o.Credentials.Empty() {
		creds = o.Credentials
	}
	shown := Redact(clean)
	interval := o.Interval
	if interval <= 0 {
		interval = DefaultInterval
	}
	auth, env := gitAuth(clean, creds)
	opts := repo.ImportOptions{GitArgs: auth, Env: append(env, "GIT_TERMINAL_PROMPT=0")}
	if o.Mirror {
		opts.Finish = func(ctx context.Context, dir string) error {
			if err := storeCredentials(dir, PullRemote, creds); err != nil {
				return err
			}
			return setConfig(ctx, dir, KeyPullMirror, PullRemote, KeyInterval, interval.String())
		}
	}
	r, err := root.ImportWith(ctx, name, clean, opts)
	if err != nil {
		return r, shown, errors.New(scrub(err.Error(), creds))
	}
	return r, shown, nil
}

// withToken makes a token the password, with the URL's user name or
// DefaultTokenUser.
func withToken(c Credentials, token string) Credentials {
	if token == "" {
		return c
	}
	if c.Username == "" {
		c.Username = DefaultTokenUser
	}
	c.Password = token
	return c
}

// AddPush adds a push mirror to the repository: its remote
// (packwire-push-ID, with mirror = true) in the config, its credentials
// (from the URL or the token) in the credentials file.
func AddPush(ctx context.Context, r repo.Repo, rawURL, token string) (PushMirror, error) {
	clean, creds, err := SplitURL(rawURL)
	if err != nil {
		return PushMirror{}, err
	}
	creds = withToken(creds, token)
	cfg, err := ReadConfig(r)
	if err != nil {
		return PushMirror{}, err
	}
	// A pull mirror may have push mirrors too: its syncs are sent on.
	id := 1
	for _, p := range cfg.Pushes {
		id = max(id, p.ID+1)
	}
	pm := PushMirror{ID: id, Remote: PushRemotePrefix + strconv.Itoa(id), URL: clean}
	if err := storeCredentials(r.Path, pm.Remote, creds); err != nil {
		return PushMirror{}, err
	}
	if err := setConfig(ctx, r.Path, "remote."+pm.Remote+".url", clean, "remote."+pm.Remote+".mirror", "true"); err != nil {
		storeCredentials(r.Path, pm.Remote, Credentials{})
		return PushMirror{}, err
	}
	return pm, nil
}

// RemovePush removes a push mirror with its credentials.
func RemovePush(ctx context.Context, r repo.Repo, id int) (PushMirror, error) {
	cfg, err := ReadConfig(r)
	if err != nil {
		return PushMirror{}, err
	}
	pm, ok := cfg.Push(id)
	if !ok {
		return PushMirror{}, fmt.Errorf("%s has no push mirror %d", r.Name, id)
	}
	if _, err := git(ctx, "", nil, "config", "--file", filepath.Join(r.Path, "config"), "--remove-section", "remote."+pm.Remote); err != nil {
		return PushMirror{}, err
	}
	return pm, storeCredentials(r.Path, pm.Remote, Credentials{})
}

// HasCredentials reports whether a remote of the repository has stored
// credentials (what listings show instead of them).
func HasCredentials(r repo.Repo, remote string) bool {
	c, err := credentialsOf(r, remote)
	return err == nil && !c.Empty()
}
