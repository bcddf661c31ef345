// Package labserver runs a packwire server inside the calling process on
// 127.0.0.1, serving one repository over HTTP with a server admin's token
// for its governor: the target of `packwire bench --demo` and of the lab's
// end-to-end tests. It is apart from package bench so that the bench, which
// measures any server, does not depend on packwire's own.
package labserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"packwire/internal/lab/bench"
	"packwire/internal/server"
	"packwire/internal/store"
)

// Server is a running packwire with one repository.
type Server struct {
	Server   *server.Server
	URL      string          // anonymous clone URL
	PushURL  string          // the same with the admin's token (for the pusher)
	Governor *bench.Governor // the server's governor API with the admin's token
	RepoPath string
}

// Options configure Start.
type Options struct {
	DataDir string // created if missing
	Repo    string // repository name (default "lab/demo")
	// Build fills the bare repository at path, which does not exist yet.
	Build func(ctx context.Context, path string) error
	// Maintain brings the repository into packwire's serving layout first,
	// as `packwire repo import` does.
	Maintain     bool
	RecordsFlush time.Duration // governor batch interval (default 100 ms)
	Log          *slog.Logger  // default: discard
	// Mutate, if set, may change the server's configuration (limits).
	Mutate func(*server.Config)
}

// Start builds the repository, starts the server and makes the
// admin token. Close stops it.
func Start(ctx context.Context, o Options) (*Server, error) {
	if o.Repo == "" {
		o.Repo = "lab/demo"
	}
	if o.Build == nil {
		return nil, errors.New("local server: nothing builds the repository")
	}
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.RecordsFlush <= 0 {
		o.RecordsFlush = 100 * time.Millisecond
	}
	cfg := server.Defaults
	cfg.DataDir = o.DataDir
	cfg.GitAddr, cfg.SSHAddr, cfg.HTTPAddr = "", "", "127.0.0.1:0"
	cfg.MaintainInterval = 0 // no background maintenance in the middle of a measurement
	cfg.RecordsFlush = o.RecordsFlush
	cfg.Log = o.Log
	if o.Mutate != nil {
		o.Mutate(&cfg)
	}
	srv, err := server.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	ls := &Server{Server: srv, RepoPath: srv.Data.Repos.PathFor(o.Repo)}
	fail := func(err error) (*Server, error) {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(ls.RepoPath), 0o755); err != nil {
		return fail(err)
	}
	if err := o.Build(ctx, ls.RepoPath); err != nil {
		return fail(fmt.Errorf("building the repository: %w", err))
	}
	if o.Maintain {
		r, err := srv.Data.Repos.Resolve(o.Repo)
		if err != nil {
			return fail(err)
		}
		if _, err := srv.Maintainer.Maintain(ctx, r, true); err != nil {
			return fail(fmt.Errorf("maintaining the repository: %w", err))
		}
	}
	if err := srv.Start(); err != nil {
		return fail(err)
	}
	const admin = "lab"
	if _, err := srv.Data.Store.AddUser(ctx, admin); err != nil && !errors.Is(err, store.ErrExists) {
		return fail(err)
	}
	if err := srv.Data.Store.SetGrant(ctx, store.Grant{User: admin, RepoPattern: "**", Role: "admin"}); err != nil {
		return fail(err)
	}
	token, err := srv.Data.Access.CreateToken(ctx, admin, 0)
	if err != nil {
		return fail(err)
	}
	host := srv.HTTPAddr.String()
	ls.URL = "http://" + host + "/" + o.Repo + ".git"
	ls.PushURL = "http://" + admin + ":" + token + "@" + host + "/" + o.Repo + ".git"
	ls.Governor = &bench.Governor{URL: "http://" + host, Token: token}
	return ls, nil
}

// Close stops the server, letting running requests finish for a few seconds.
func (l *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return l.Server.Shutdown(ctx)
}
