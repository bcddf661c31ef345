package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"packwire/internal/mirror"
	"packwire/internal/repo"
	"packwire/internal/server/cluster"
	"packwire/internal/server/cluster/route"
	"packwire/internal/store"
)

// openCluster makes this server a node of the cluster its store is in
// (Config.Node): the cluster user's secret for access, the hooks of pushes
// on a primary, and the pipeline's router. It joins at Start, once its
// HTTP listener (which other nodes call) is bound.
func (s *Server) openCluster(ctx context.Context) error {
	cfg := s.Config
	if s.Data.Store.DB.Engine != store.Postgres {
		return fmt.Errorf("--node %s: a cluster's nodes share a PostgreSQL store: pass --database postgres://...", cfg.Node)
	}
	if err := cluster.ValidName(cfg.Node); err != nil {
		return err
	}
	if cfg.HTTPAddr == "" {
		return errors.New("--node: nodes reach each other over HTTP: --http must not be empty")
	}
	secret, err := clusterSecret(ctx, s.Data.Store)
	if err != nil {
		return fmt.Errorf("cluster secret: %w", err)
	}
	s.Data.Access.ClusterSecret = secret
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	hooks := filepath.Join(s.Data.Dir, "run", "cluster-hooks")
	if err := route.InstallHooks(hooks, exe, clusterHook(cfg.ClusterHook, exe)); err != nil {
		return fmt.Errorf("cluster hooks: %w", err)
	}
	s.Node = &cluster.Node{DB: s.Data.Store.DB, Name: cfg.Node, URL: cfg.NodeURL, Heartbeat: cfg.NodeHeartbeat, Timeout: cfg.NodeTimeout, Log: cfg.Log,
		Reach: route.Ping}
	s.Router = &route.Router{Node: s.Node, Secret: secret, HooksDir: hooks, Repos: s.Data.Repos}
	s.Pipeline.Cluster = s.Router
	if s.LFS != nil {
		s.LFS.Cluster = s.Router // every node serves every repository's objects
	}
	// Mirrors: only a repository's primary syncs it (its ref transaction
	// replicated as a push's) or pushes it to a push mirror; other nodes
	// ask it (route.MirrorPath).
	s.Mirrors.Transaction = s.Router.RefTransaction
	kind := s.Outbox.Kinds[store.KindPushMirror]
	local := kind.Sender.(*mirror.Pusher)
	kind.Sender = &route.MirrorPusher{Router: s.Router, Local: local}
	s.Outbox.Kinds[store.KindPushMirror] = kind
	s.mirrorCalls = route.MirrorHandler(s.Router, s.Data.Access,
		func(ctx context.Context, r repo.Repo) (mirror.SyncResult, error) {
			return s.Mirrors.Sync(ctx, r, "on demand")
		},
		local.Send)
	return nil
}

// clusterHook is the binary of the reference-transaction hook: the small
// packwire-hook when installed next to packwire (it starts in about a
// millisecond, packwire in several, and git starts it twice per push),
// else packwire itself.
func clusterHook(configured, exe string) string {
	if configured != "" {
		return configured
	}
	small := filepath.Join(filepath.Dir(exe), "packwire-hook")
	if info, err := os.Stat(small); err == nil && info.Mode().IsRegular() && info.Mode()&0o111 != 0 {
		return small
	}
	return exe
}

// clusterSecret reads the cluster user's password, creating it once.
func clusterSecret(ctx context.Context, st *store.Store) (string, error) {
	b := make([]byte, 32)
	rand.Read(b)
	if _, err := st.DB.ExecContext(ctx, "INSERT INTO settings(key, value) VALUES(?, ?) ON CONFLICT(key) DO NOTHING", cluster.SettingSecret, hex.EncodeToString(b)); err != nil {
		return "", err
	}
	return st.Setting(ctx, cluster.SettingSecret, "")
}

// startCluster joins the cluster and runs the node's loop: heartbeat,
// failover, and catching up this node's copies.
func (s *Server) startCluster() error {
	if s.Node == nil {
		return nil
	}
	if s.Node.URL == "" {
		s.Node.URL = defaultNodeURL(s.HTTPAddr, s.Config.TLSCert != "")
	}
	s.Node.Listeners = fmt.Sprintf("git=%v http=%v ssh=%v", s.GitAddr, s.HTTPAddr, s.SSHAddr)
	// The heartbeat's own connection: requests filling the store's pool
	// (pushes waiting for a row lock) must not make this node look dead.
	membership, err := store.OpenPostgresPool(s.Data.Database, "", 1)
	if err != nil {
		return err
	}
	s.Node.Membership = membership
	ctx, cancel := context.WithCancel(context.Background())
	// The hooks of pushes on this node's primaries ask the server over a
	// socket only this user can reach (they hold the server's token too).
	if err := s.Router.ServeHooks(ctx, filepath.Join(s.Data.Dir, "run", "cluster", "hook.sock")); err != nil {
		cancel()
		membership.Close()
		return err
	}
	if err := s.Node.Join(ctx); err != nil {
		cancel()
		membership.Close()
		return err
	}
	s.Node.OnTick = func(ctx context.Context) {
		if err := s.Router.Reconcile(ctx); err != nil && ctx.Err() == nil {
			s.Config.Log.Warn("cluster: catching up copies", "node", s.Node.Name, "error", err.Error())
		}
	}
	s.stopNode = cancel
	s.wg.Add(1)
	go func() { defer s.wg.Done(); s.Node.Run(ctx) }()
	return nil
}

// defaultNodeURL is how other nodes reach this one when --node-url is not
// given: the HTTP listener, with this machine's host name for a listener
// on every address (":8080").
func defaultNodeURL(addr net.Addr, tls bool) string {
	scheme := "http://"
	if tls {
		scheme = "https://"
	}
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return scheme + addr.String()
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
		if name, err := os.Hostname(); err == nil && name != "" {
			host = name
		}
	}
	return scheme + net.JoinHostPort(host, port)
}
