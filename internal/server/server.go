// Package server assembles a running packwire: the data directory, the
// request pipeline and the three transports on their listeners, and a
// graceful shutdown that lets running requests finish.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	nethttp "net/http"
	"path/filepath"
	"sync"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"packwire/internal/datadir"
	"packwire/internal/gitexec"
	"packwire/internal/governor"
	"packwire/internal/maintain"
	"packwire/internal/pipeline"
	"packwire/internal/transport/daemon"
	httptransport "packwire/internal/transport/http"
	sshtransport "packwire/internal/transport/ssh"
)

// Config is what `packwire serve` takes. Empty addresses turn a transport off.
type Config struct {
	DataDir  string
	GitAddr  string // git:// listener, e.g. ":9418"
	HTTPAddr string // smart HTTP listener, e.g. ":8080"
	SSHAddr  string // SSH listener, e.g. ":2222"

	TLSCert, TLSKey string // serve HTTPS when both are set

	InitTimeout    time.Duration // for the first request line / SSH handshake
	IdleTimeout    time.Duration // no data either way for this long ends a request
	MaxConnections int           // per transport; 0: no limit
	MaxRequestBody int64         // decoded HTTP fetch request bound
	SSHCiphers     []string
	SSHKeepAlive   time.Duration

	MetricsAddr     string        // separate listener for /metrics; empty: /metrics on the HTTP listener
	RecordsMaxAge   time.Duration // governor retention by age (0: keep)
	RecordsMaxCount int           // governor retention by count (0: no bound)

	MaintainInterval    time.Duration // how often repositories are checked for maintenance (0: never)
	MaintainConcurrency int           // repositories maintained at once
	MaintainBudget      time.Duration // maintenance CPU allowed per hour (0: no bound)

	Log *slog.Logger
}

// Defaults are the values `packwire serve` uses when no flag is given.
var Defaults = Config{
	DataDir:         datadir.DefaultDir,
	GitAddr:         ":9418",
	HTTPAddr:        ":8080",
	SSHAddr:         ":2222",
	InitTimeout:     30 * time.Second,
	IdleTimeout:     10 * time.Minute,
	MaxConnections:  1024,
	MaxRequestBody:  httptransport.DefaultMaxRequestBody,
	SSHKeepAlive:    30 * time.Second,
	RecordsMaxAge:   30 * 24 * time.Hour,
	RecordsMaxCount: 1_000_000,

	MaintainInterval:    10 * time.Minute,
	MaintainConcurrency: 1,
	MaintainBudget:      15 * time.Minute,
}

// Server is a running packwire.
type Server struct {
	Config   Config
	Data     *datadir.Data
	Pipeline *pipeline.Pipeline
	Governor *governor.Governor
	HostKey  gossh.Signer
	// Maintainer keeps repositories in the serving layout; its scheduler
	// runs in the background from Start to Shutdown.
	Maintainer *maintain.Maintainer

	// Listening addresses, set by Start for the listeners that are on.
	GitAddr, HTTPAddr, SSHAddr, MetricsAddr net.Addr

	metrics *nethttp.Server
	daemon  *daemon.Server
	http    *nethttp.Server
	ssh     *sshtransport.Server
	wg      sync.WaitGroup
	errMu   sync.Mutex
	err     error

	stopMaintain context.CancelFunc // ends the maintenance scheduler
}

// New opens the data directory (creating it) and builds the pipeline.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	data, err := datadir.Open(ctx, cfg.DataDir)
	if err != nil {
		return nil, err
	}
	gov, err := governor.Open(ctx, filepath.Join(data.Dir, governor.FileName))
	if err != nil {
		data.Close()
		return nil, err
	}
	s := &Server{Config: cfg, Data: data, Governor: gov}
	s.Pipeline = &pipeline.Pipeline{
		Repos:    data.Repos,
		Access:   data.Access,
		Runner:   &gitexec.Runner{IdleTimeout: cfg.IdleTimeout},
		Governor: gov,
		Log:      cfg.Log,
	}
	s.Maintainer = maintain.New(maintain.Options{Log: cfg.Log, Record: gov.RecordMaintenance})
	gov.RegisterGauge("packwire_requests_in_flight", "Git processes running now.", func() float64 { return float64(s.Pipeline.InFlight()) })
	if cfg.SSHAddr != "" {
		if s.HostKey, err = data.HostKey(); err != nil {
			gov.Close()
			data.Close()
			return nil, err
		}
	}
	return s, nil
}

// Start listens on every configured address and serves in the background.
func (s *Server) Start() error {
	cfg := s.Config
	var listeners []net.Listener
	fail := func(err error) error {
		for _, l := range listeners {
			l.Close()
		}
		return err
	}
	listen := func(addr, what string) (net.Listener, error) {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("%s listener: %w", what, err)
		}
		listeners = append(listeners, l)
		return l, nil
	}

	var gitL, httpL, sshL net.Listener
	var err error
	if cfg.GitAddr != "" {
		if gitL, err = listen(cfg.GitAddr, "git://"); err != nil {
			return fail(err)
		}
	}
	if cfg.HTTPAddr != "" {
		if httpL, err = listen(cfg.HTTPAddr, "http"); err != nil {
			return fail(err)
		}
		if cfg.TLSCert != "" || cfg.TLSKey != "" {
			cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
			if err != nil {
				return fail(fmt.Errorf("TLS: %w", err))
			}
			httpL = tls.NewListener(httpL, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}})
		}
	}
	if cfg.SSHAddr != "" {
		if sshL, err = listen(cfg.SSHAddr, "ssh"); err != nil {
			return fail(err)
		}
	}
	var metricsL net.Listener
	if cfg.MetricsAddr != "" {
		if metricsL, err = listen(cfg.MetricsAddr, "metrics"); err != nil {
			return fail(err)
		}
	}
	s.Governor.Start(governor.Options{MaxAge: cfg.RecordsMaxAge, MaxRows: cfg.RecordsMaxCount, Log: cfg.Log})

	if gitL != nil {
		s.GitAddr = gitL.Addr()
		s.daemon = &daemon.Server{Pipeline: s.Pipeline, InitTimeout: cfg.InitTimeout, MaxConnections: cfg.MaxConnections, Log: cfg.Log}
		s.serve("git://", func() error { return s.daemon.Serve(gitL) }, daemon.ErrServerClosed)
	}
	if httpL != nil {
		s.HTTPAddr = httpL.Addr()
		git := &httptransport.Handler{
			Pipeline:       s.Pipeline,
			Access:         s.Data.Access,
			MaxRequestBody: cfg.MaxRequestBody,
			Log:            cfg.Log,
		}
		routes := map[string]nethttp.Handler{}
		if metricsL == nil {
			routes["/metrics"] = s.Governor.MetricsHandler()
		}
		s.http = &nethttp.Server{
			Handler:           exactRoutes(routes, git),
			ReadHeaderTimeout: cfg.InitTimeout,
			IdleTimeout:       cfg.IdleTimeout,
			MaxHeaderBytes:    64 << 10,
			ErrorLog:          slog.NewLogLogger(cfg.Log.Handler(), slog.LevelWarn),
		}
		s.serve("http", func() error { return s.http.Serve(httpL) }, nethttp.ErrServerClosed)
	}
	if metricsL != nil {
		s.MetricsAddr = metricsL.Addr()
		s.metrics = &nethttp.Server{Handler: exactRoutes(map[string]nethttp.Handler{"/metrics": s.Governor.MetricsHandler()}, nethttp.NotFoundHandler()), ReadHeaderTimeout: cfg.InitTimeout}
		s.serve("metrics", func() error { return s.metrics.Serve(metricsL) }, nethttp.ErrServerClosed)
	}
	if cfg.MaintainInterval > 0 {
		sched := &maintain.Scheduler{M: s.Maintainer, Repos: s.Data.Repos.List, Interval: cfg.MaintainInterval,
			Concurrency: cfg.MaintainConcurrency, Budget: cfg.MaintainBudget}
		ctx, cancel := context.WithCancel(context.Background())
		s.stopMaintain = cancel
		s.wg.Add(1)
		go func() { defer s.wg.Done(); sched.Run(ctx) }()
	}
	if sshL != nil {
		s.SSHAddr = sshL.Addr()
		s.ssh = &sshtransport.Server{
			Pipeline:       s.Pipeline,
			Access:         s.Data.Access,
			HostKey:        s.HostKey,
			Ciphers:        cfg.SSHCiphers,
			InitTimeout:    cfg.InitTimeout,
			KeepAlive:      cfg.SSHKeepAlive,
			MaxConnections: cfg.MaxConnections,
			Log:            cfg.Log,
		}
		s.serve("ssh", func() error { return s.ssh.Serve(sshL) }, sshtransport.ErrServerClosed)
	}
	return nil
}

func (s *Server) serve(what string, serve func() error, closed error) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := serve(); err != nil && !errors.Is(err, closed) {
			s.Config.Log.Error("transport stopped", "transport", what, "error", err.Error())
			s.errMu.Lock()
			s.err = errors.Join(s.err, fmt.Errorf("%s: %w", what, err))
			s.errMu.Unlock()
		}
	}()
}

// exactRoutes sends a request whose path is exactly a key of routes to that
// handler and everything else to fallback. Not http.ServeMux: it cleans
// paths and redirects, which would turn "/team/../other" into "/other".
func exactRoutes(routes map[string]nethttp.Handler, fallback nethttp.Handler) nethttp.Handler {
	return nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) {
		if h, ok := routes[r.URL.Path]; ok && (r.Method == nethttp.MethodGet || r.Method == nethttp.MethodHead) {
			h.ServeHTTP(w, r)
			return
		}
		fallback.ServeHTTP(w, r)
	})
}

// HostKeyFingerprint is the SHA256 fingerprint clients see for the SSH host key.
func (s *Server) HostKeyFingerprint() string {
	if s.HostKey == nil {
		return ""
	}
	return gossh.FingerprintSHA256(s.HostKey.PublicKey())
}

// Shutdown stops accepting, lets running requests finish until ctx ends,
// then kills what remains and closes the store.
func (s *Server) Shutdown(ctx context.Context) error {
	if s.daemon != nil {
		s.daemon.Close()
	}
	if s.ssh != nil {
		s.ssh.Close()
	}
	httpDone := make(chan error, 1)
	if s.http != nil {
		// http.Server.Shutdown waits for active requests; the pipeline kills
		// their git children if the grace period ends first.
		go func() { httpDone <- s.http.Shutdown(ctx) }()
	} else {
		httpDone <- nil
	}
	drainErr := s.Pipeline.Shutdown(ctx)
	if err := <-httpDone; err != nil && drainErr == nil {
		s.http.Close()
		drainErr = err
	}
	if s.daemon != nil {
		s.daemon.Wait()
	}
	if s.ssh != nil {
		s.ssh.Wait()
	}
	if s.metrics != nil {
		s.metrics.Close()
	}
	if s.stopMaintain != nil {
		s.stopMaintain() // a maintenance run in progress is killed; the layout stays servable
	}
	s.wg.Wait()
	s.Governor.Close()
	s.Data.Close()
	s.errMu.Lock()
	defer s.errMu.Unlock()
	return errors.Join(drainErr, s.err)
}
