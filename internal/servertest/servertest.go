// Package servertest starts a whole packwire in-process for the end-to-end
// tests of other packages: git://, smart HTTP and SSH on 127.0.0.1:0, a
// temporary data directory, anonymous read on (an SSH key nobody
// registered reads as anonymous), and a real git client environment.
package servertest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"packwire/internal/gittest"
	"packwire/internal/hostkeytest"
	"packwire/internal/server"
	"packwire/internal/store"
)

// Server is a running packwire with a git client environment.
type Server struct {
	*server.Server
	Env *gittest.Env
	// SSHKey is a client key (unregistered, so anonymous) for SSH URLs; ""
	// when SSH is off.
	SSHKey string
}

// Start starts a packwire on loopback for the test and stops it at the
// test's end. mutate, if not nil, may change the configuration first.
func Start(t testing.TB, mutate func(*server.Config)) *Server {
	t.Helper()
	env := gittest.New(t)
	cfg := server.Defaults
	cfg.DataDir = filepath.Join(t.TempDir(), "data")
	cfg.GitAddr, cfg.HTTPAddr, cfg.SSHAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.MaintainInterval = 0
	cfg.RecordsFlush = 50 * time.Millisecond
	if mutate != nil {
		mutate(&cfg)
	}
	if cfg.SSHAddr != "" {
		hostkeytest.Copy(t, cfg.DataDir) // generated once, not per server
	}
	srv, err := server.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	s := &Server{Server: srv, Env: env}
	if cfg.SSHAddr != "" {
		s.SSHKey = env.NewSSHKey("id_servertest")
	}
	return s
}

// Token creates user with role on every repository and returns an HTTP
// token of theirs.
func (s *Server) Token(t testing.TB, user, role string) string {
	t.Helper()
	ctx := context.Background()
	if _, err := s.Data.Store.AddUser(ctx, user); err != nil {
		t.Fatal(err)
	}
	if err := s.Data.Store.SetGrant(ctx, store.Grant{User: user, RepoPattern: "**", Role: role}); err != nil {
		t.Fatal(err)
	}
	token, err := s.Data.Access.CreateToken(ctx, user, 0)
	if err != nil {
		t.Fatal(err)
	}
	return token
}

// Repo creates repository name with a synthetic history of the shape.
func (s *Server) Repo(t testing.TB, name string, shape gittest.Shape) string {
	t.Helper()
	r, err := s.Data.Repos.Create(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	s.Env.Build(r.Path, shape)
	return r.Path
}

// GitURL, HTTPURL and SSHURL name a repository over each transport.
func (s *Server) GitURL(name string) string  { return fmt.Sprintf("git://%s/%s", s.GitAddr, name) }
func (s *Server) HTTPURL(name string) string { return fmt.Sprintf("http://%s/%s", s.HTTPAddr, name) }
func (s *Server) SSHURL(name string) string  { return fmt.Sprintf("ssh://git@%s/%s", s.SSHAddr, name) }
