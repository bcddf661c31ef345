// Package server assembles a running packwire: the data directory, the
// request pipeline and the three transports on their listeners, and a
// graceful shutdown that lets running requests finish.
package server

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	nethttp "net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"packwire/internal/buildinfo"
	"packwire/internal/dashboard"
	"packwire/internal/datadir"
	"packwire/internal/fetchcache"
	"packwire/internal/gitexec"
	"packwire/internal/governor"
	"packwire/internal/handover"
	"packwire/internal/lfs"
	"packwire/internal/lifecycle"
	"packwire/internal/limiter"
	"packwire/internal/maintain"
	"packwire/internal/mirror"
	"packwire/internal/outbox"
	"packwire/internal/packcache"
	"packwire/internal/pipeline"
	"packwire/internal/pushguard"
	"packwire/internal/reach"
	"packwire/internal/repo"
	"packwire/internal/server/cluster"
	"packwire/internal/server/cluster/route"
	"packwire/internal/store"
	"packwire/internal/transport/accept"
	"packwire/internal/transport/daemon"
	"packwire/internal/transport/forwarded"
	httptransport "packwire/internal/transport/http"
	"packwire/internal/transport/httpdrain"
	sshtransport "packwire/internal/transport/ssh"
)

// Config is what `packwire serve` takes. Empty addresses turn a transport off.
type Config struct {
	DataDir  string
	Database string // "" (SQLite in DataDir) or a postgres:// URL for the store
	// DatabaseMaxConns bounds the store's pool of PostgreSQL connections
	// (0: store.DefaultMaxConns); the request records and a cluster
	// node's membership have pools of their own (governor.MaxConns, 1).
	DatabaseMaxConns int
	// Node makes this server a node of the cluster in Database (see
	// internal/server/cluster); "": a single server.
	Node          string
	NodeURL       string        // how other nodes reach this one; "": http://HTTP listener
	NodeHeartbeat time.Duration // between heartbeats
	NodeTimeout   time.Duration // a node whose heartbeat is older is unhealthy
	// ClusterHook is the reference-transaction hook binary of pushes on a
	// primary (cmd/packwire-hook); "": packwire-hook next to this
	// executable if there is one, else this executable.
	ClusterHook string
	GitAddr     string // git:// listener, e.g. ":9418"
	HTTPAddr    string // smart HTTP listener, e.g. ":8080"
	SSHAddr     string // SSH listener, e.g. ":2222"

	// Listeners are sockets this process inherited (internal/handover),
	// by name: "git", "http", "ssh", "metrics"; systemd's unnamed ones
	// ("fd3"...) are matched to an address by port. A transport with one
	// uses it instead of listening on its address.
	Listeners map[string]net.Listener
	// HandedOver: a previous packwire may still be finishing requests on
	// this data directory, so what a crash leaves behind (ref locks,
	// request bodies, the caches' files) is not cleared at start.
	HandedOver bool

	TLSCert, TLSKey string // serve HTTPS when both are set

	// TrustedProxies are the reverse proxies whose X-Forwarded-For and
	// X-Forwarded-Proto are believed: the client address they name is the
	// one requests record, log and count against MaxRequestsPerClient.
	// Empty: the headers are ignored.
	TrustedProxies forwarded.Trusted

	InitTimeout    time.Duration // for the first request line / SSH handshake
	IdleTimeout    time.Duration // no data either way for this long ends a request
	MaxConnections int           // per listener (git://, SSH, HTTP); 0: no limit
	// MaxStartupsPerAddress bounds, per listener and client address, the
	// connections that have not sent a complete request yet (see
	// accept.Startups); 0: an eighth of MaxConnections, at least 10 (none
	// without MaxConnections). Trusted proxies are not bounded.
	MaxStartupsPerAddress int
	// PenaltyMax bounds how long an address that keeps misbehaving
	// (malformed requests, handshakes that fail or never end, connections
	// over MaxStartupsPerAddress) is refused at accept, as OpenSSH's
	// PerSourcePenalties; 0: off. PenaltyMin is the penalty it must run up
	// before it is refused (see accept.Penalties). Trusted proxies are exempt.
	PenaltyMax, PenaltyMin time.Duration
	MaxRequestBody         int64 // decoded HTTP fetch request bound
	// Fetch request bodies over 1 MiB wait whole in DATA/tmp before they
	// run: at most MaxSpooledBytes of them in all, MaxSpooledBytesPerAddr
	// per client address; more are refused with "server busy" (0: no bound).
	MaxSpooledBytes        int64
	MaxSpooledBytesPerAddr int64

	SSHCiphers     []string
	SSHKeepAlive   time.Duration
	SSHIdleTimeout time.Duration // close an SSH connection once no command ran for this long after its last (0: never)
	SSHMaxSessions int           // session channels open at once per SSH connection (0: no limit)
	SSHMaxUnacked  int           // output an SSH client may hold unread, by estimate (0: its whole window)

	PackCache             bool          // share identical pack-objects runs between fetches
	PackCacheMaxBytes     int64         // finished packs kept on disk, in total
	PackCacheMaxAge       time.Duration // how long a finished pack may be reused
	PackCacheMinUses      int           // keep a finished pack once its key was asked this often
	PackCacheMinFreeBytes int64         // below this much free disk the cache stands aside

	FetchCache             bool          // store and replay whole responses to HTTP v2 fetches without haves
	FetchCacheMaxBytes     int64         // stored responses kept on disk, in total
	FetchCacheMaxAge       time.Duration // how long a stored response may be replayed
	FetchCacheMinFreeBytes int64         // below this much free disk the fetch cache stands aside
	// FetchCacheSightingWindow: a response to a fetch with haves is stored
	// only if an identical request was seen this recently (fetchcache).
	FetchCacheSightingWindow time.Duration

	MaxPackJobs        int           // concurrent pack-generating requests in all (0: no limit)
	MaxPackJobsPerRepo int           // ... per repository (0: no limit)
	MaxQueue           int           // requests waiting for a slot; more are refused at once
	MaxQueueWait       time.Duration // a queued request is refused after this long

	MaxPushJobs int // concurrent pushes that write (receive-pack running), in all (0: no limit)
	// MaxPushesPerUser bounds the pushes that write one user runs at once,
	// so that no one identity holds every push slot (0: no bound; the
	// default is PushesPerUser(MaxPushJobs)).
	MaxPushesPerUser int
	MaxPushRefs      int   // ref updates one push may carry (0: pipeline.DefaultMaxPushRefs)
	MaxPushBytes     int64 // the pack of one push, in bytes (0: no bound)
	FsckPushes       bool  // git checks every pushed object (receive.fsckObjects)

	// A fetch request (an HTTP body, a git:// or SSH fetch command) must
	// arrive at RequestMinRate bytes/s on average after InitTimeout, and
	// whole within RequestTimeout, before it takes a slot (0: no bound).
	RequestMinRate int64
	RequestTimeout time.Duration
	// MaxRequestsPerClient bounds the requests (git processes) one user, or
	// one anonymous address, runs at once (0: no bound).
	MaxRequestsPerClient int
	// AllowUnreachableWants serves any object by id, as git's protocol v2
	// does; off: only objects a visible ref reaches (internal/reach).
	AllowUnreachableWants bool
	// ObjectInfo serves protocol v2's object-info (any object's size by
	// id, reachable or not); off: neither advertised nor answered.
	ObjectInfo bool
	// BundleURIs advertises protocol v2's bundle-uri and serves each
	// maintained repository's clone bundle at /NAME.git/bundle over HTTP.
	BundleURIs bool
	// BundleBaseURL is the base URL bundle URIs point at (BASE/NAME.git/bundle):
	// the HTTP listener as clients reach it, or a static copy of the
	// bundles ("": over HTTP the address the client used, over git:// and
	// SSH http:// and the HTTP listener's address).
	BundleBaseURL string

	// LFS serves Git LFS (HTTP API under /NAME.git/info/lfs, SSH
	// git-lfs-authenticate) from DATA/lfs.
	LFS bool
	// MaxLFSObjectBytes bounds one LFS object (0: no bound).
	MaxLFSObjectBytes int64
	// LFSRequireObjects refuses a push whose new LFS pointers name objects
	// the server does not hold for the repository.
	LFSRequireObjects bool
	// LFSURL is the base URL (scheme://host:port) clients reach the HTTP
	// listener at, for the hrefs SSH's git-lfs-authenticate answers
	// ("": http:// and the HTTP listener's address).
	LFSURL string
	// LFSStore is where LFS objects live: "" the disk under DATA/lfs, or
	// an s3://BUCKET?endpoint=... URL (lfs.OpenS3), which a cluster's
	// nodes need (they share it, and the index in PostgreSQL).
	LFSStore string

	MetricsAddr string // separate listener for /metrics; empty: /metrics on the HTTP listener
	// MetricsPublic serves /metrics on the HTTP listener to anyone; off, it
	// needs a token scoped to metrics or a server admin's (a separate
	// MetricsAddr is always open: firewall it).
	MetricsPublic   bool
	RecordsMaxAge   time.Duration // governor retention by age (0: keep)
	RecordsMaxCount int           // governor retention by count (0: no bound)
	RecordsFlush    time.Duration // governor batch interval (default 500ms)

	MaintainInterval    time.Duration // how often repositories are checked for maintenance (0: never)
	MaintainConcurrency int           // repositories maintained at once
	MaintainBudget      time.Duration // maintenance CPU allowed per hour (0: no bound)
	// TrashRetention is how long deleted repositories stay restorable;
	// the maintenance scheduler removes older ones (0: kept for good).
	TrashRetention time.Duration

	LabDir string // the lab's reports, shown by the dashboard (default DATA/lab)

	// Webhooks and push mirrors (internal/outbox, outgoing.go).
	DeliveryConcurrency int           // attempts in flight in all, one per target at most
	HookTimeout         time.Duration // one webhook POST, answer included
	MirrorPushTimeout   time.Duration // one push to a push mirror
	DeliveryMinBackoff  time.Duration // the first retry's wait, doubling per failure...
	DeliveryMaxBackoff  time.Duration // ...up to this
	DeliveryGiveUp      time.Duration // a delivery fails for good this long after it was queued
	DeliveryPoll        time.Duration // how often queued rows are looked for (the command line's, retries)
	MirrorCheck         time.Duration // how often pull mirrors are checked for a due sync (0: never)

	Log *slog.Logger
}

// PushesPerUser is the default bound on one user's concurrent pushes for
// a server with maxPushJobs push slots: half of them, at least 1 (0: no
// slot bound, no user bound).
func PushesPerUser(maxPushJobs int) int {
	if maxPushJobs <= 0 {
		return 0
	}
	return max(1, maxPushJobs/2)
}

// Defaults are the values `packwire serve` uses when no flag is given.
var Defaults = Config{
	DataDir:          datadir.DefaultDir,
	DatabaseMaxConns: store.DefaultMaxConns,
	GitAddr:          ":9418",
	HTTPAddr:         ":8080",
	SSHAddr:          ":2222",
	InitTimeout:      30 * time.Second,
	IdleTimeout:      10 * time.Minute,
	MaxConnections:   1024,
	PenaltyMax:       10 * time.Minute,
	PenaltyMin:       15 * time.Second,
	MaxRequestBody:   httptransport.DefaultMaxRequestBody,
	SSHKeepAlive:     30 * time.Second,
	SSHIdleTimeout:   10 * time.Minute,
	SSHMaxSessions:   10,
	SSHMaxUnacked:    sshtransport.DefaultMaxUnacked,
	RecordsMaxAge:    30 * 24 * time.Hour,
	RecordsMaxCount:  1_000_000,

	MaxPackJobs:        max(4, 2*runtime.NumCPU()),
	MaxPackJobsPerRepo: max(2, runtime.NumCPU()),
	MaxQueue:           256,
	MaxQueueWait:       60 * time.Second,
	MaxPushJobs:        max(4, 2*runtime.NumCPU()),
	MaxPushesPerUser:   PushesPerUser(max(4, 2*runtime.NumCPU())),
	MaxPushRefs:        pipeline.DefaultMaxPushRefs,
	FsckPushes:         true,

	LFS:               true,
	LFSRequireObjects: true,

	RequestMinRate:       1024,
	RequestTimeout:       5 * time.Minute,
	MaxRequestsPerClient: 64,

	MaxSpooledBytes:        1 << 30,
	MaxSpooledBytesPerAddr: 256 << 20,

	PackCache:             false, // opt-in: see docs/clone-storms.md for the measurement
	PackCacheMaxBytes:     2 << 30,
	PackCacheMaxAge:       5 * time.Minute,
	PackCacheMinUses:      1,
	PackCacheMinFreeBytes: 1 << 30,

	FetchCache:               true,
	BundleURIs:               true,
	FetchCacheMaxBytes:       2 << 30,
	FetchCacheMaxAge:         5 * time.Minute,
	FetchCacheMinFreeBytes:   1 << 30,
	FetchCacheSightingWindow: fetchcache.DefaultSightingWindow,

	MaintainInterval:    10 * time.Minute,
	MaintainConcurrency: 1,
	MaintainBudget:      15 * time.Minute,
	TrashRetention:      lifecycle.DefaultTrashRetention,

	DeliveryConcurrency: outbox.DefaultConcurrency,
	HookTimeout:         outbox.DefaultTimeout,
	MirrorPushTimeout:   mirror.DefaultPushTimeout,
	DeliveryMinBackoff:  outbox.DefaultMinBackoff,
	DeliveryMaxBackoff:  outbox.DefaultMaxBackoff,
	DeliveryGiveUp:      outbox.DefaultGiveUpAfter,
	DeliveryPoll:        outbox.DefaultPoll,
	MirrorCheck:         mirror.DefaultCheck,

	NodeHeartbeat: cluster.DefaultHeartbeat,
	NodeTimeout:   cluster.DefaultNodeTimeout,
}

// Server is a running packwire.
type Server struct {
	Config   Config
	Data     *datadir.Data
	Pipeline *pipeline.Pipeline
	Governor *governor.Governor
	HostKey  gossh.Signer   // the ed25519 host key, the one fingerprint to pin
	HostKeys []gossh.Signer // every host key offered: ed25519, ECDSA, RSA
	// Maintainer keeps repositories in the serving layout; its scheduler
	// runs in the background from Start to Shutdown.
	Maintainer *maintain.Maintainer
	// Dashboard is the web dashboard under /-/ on the HTTP listener.
	Dashboard *dashboard.Handler
	// Outbox delivers webhooks and push mirrors, which Publisher queues;
	// Mirrors syncs pull mirrors (outgoing.go).
	Outbox    *outbox.Loop
	Publisher *outbox.Publisher
	Mirrors   *mirror.Syncer
	// mirrorCalls serves route.MirrorPath on a cluster node.
	mirrorCalls nethttp.Handler

	// Listening addresses, set by Start for the listeners that are on.
	GitAddr, HTTPAddr, SSHAddr, MetricsAddr net.Addr
	// Penalties are the addresses refused at accept on every listener
	// (Config.PenaltyMax); nil when off.
	Penalties *accept.Penalties

	metrics   *nethttp.Server
	stopCache chan struct{} // ends the caches' expiry loop
	hooks     net.Listener
	hooksSock os.FileInfo // the hook socket as created, removed at Shutdown only if still ours
	hooksDone chan struct{}
	// listeners are the sockets the transports accept on, by name, for
	// ListenerFiles to hand over.
	listeners map[string]net.Listener
	daemon    *daemon.Server
	http      *nethttp.Server
	// httpDrain follows the HTTP connections so that a hand over ends
	// them without losing a request (HandOver); httpServing is the
	// listener s.http accepts on.
	httpDrain   *httpdrain.Tracker
	httpServing net.Listener
	ssh         *sshtransport.Server
	wg          sync.WaitGroup
	errMu       sync.Mutex
	err         error

	stopMaintain context.CancelFunc // ends the maintenance scheduler
	stopOutgoing context.CancelFunc // ends the delivery loop and the mirror scheduler
	stopNode     context.CancelFunc // ends the cluster node's loop
	replicator   *route.Replicator  // a cluster node's replication endpoint

	// LFS is Git LFS for this data directory (nil: off).
	LFS *lfs.Service
	// lfsOff is why LFS is off though asked for, told to LFS clients.
	lfsOff string

	// Node and Router are this server's part of a cluster (Config.Node); nil otherwise.
	Node   *cluster.Node
	Router *route.Router
}

// expireTrash removes the deleted repositories past TrashRetention.
func (s *Server) expireTrash(ctx context.Context) {
	if s.Config.TrashRetention <= 0 {
		return
	}
	removed, err := lifecycle.ExpireTrash(s.Data.Repos, s.Config.TrashRetention, time.Now())
	for _, t := range removed {
		s.Config.Log.Info("trash: deleted repository removed for good", "repo", t.Name, "deleted", t.Deleted.Format(time.RFC3339), "retention", s.Config.TrashRetention.String())
		if s.Node != nil {
			// The cluster's repo restore no longer counts on this copy.
			if err := cluster.TrashRemoved(ctx, s.Node.DB, t.Name, s.Node.Name, t.Stamp()); err != nil {
				s.Config.Log.Warn("trash: cluster record of a removed copy", "repo", t.Name, "error", err.Error())
			}
		}
	}
	if err != nil {
		s.Config.Log.Error("trash: removing expired repositories", "error", err.Error())
	}
	if s.LFS != nil {
		for _, t := range removed {
			if err := lfs.Expired(ctx, s.Data.Dir, t.Name, t.Stamp()); err != nil {
				s.Config.Log.Warn("trash: LFS objects of a removed repository", "repo", t.Name, "error", err.Error())
			}
		}
	}
}

// expireTokens deletes the tokens expired for store.TokenExpiryGrace
// (mostly git-lfs-authenticate's, one per SSH LFS operation).
func (s *Server) expireTokens(ctx context.Context) {
	n, err := s.Data.Store.DeleteExpiredTokens(ctx, time.Now().Add(-store.TokenExpiryGrace))
	if err != nil {
		s.Config.Log.Warn("tokens: deleting expired tokens", "error", err.Error())
	}
	if n > 0 {
		s.Config.Log.Info("tokens: deleted expired tokens", "tokens", n)
	}
}

// sweepLFS removes LFS content no repository holds any more, after
// lfs.SweepGrace, on the maintenance scheduler's turn.
func (s *Server) sweepLFS(ctx context.Context) {
	if s.LFS == nil {
		return
	}
	n, bytes, err := s.LFS.Sweep(ctx, lfs.SweepGrace)
	if err != nil {
		s.Config.Log.Warn("lfs: removing unreferenced objects", "error", err.Error())
	}
	if n > 0 {
		s.Config.Log.Info("lfs: removed unreferenced objects", "objects", n, "bytes", bytes)
	}
}

// New opens the data directory (creating it: datadir.Create) and builds the pipeline. It
// refuses where CheckPlatform does (Windows).
func New(ctx context.Context, cfg Config) (_ *Server, err error) {
	startTime := time.Now()
	if err := CheckPlatform(); err != nil {
		return nil, err
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	data, err := datadir.CreateWith(ctx, cfg.DataDir, cfg.Database)
	if err != nil {
		return nil, err
	}
	data.Store.DB.SetMaxConns(cfg.DatabaseMaxConns)
	gov, err := governor.OpenIn(ctx, data.Dir, data.Database)
	if err != nil {
		data.Close()
		return nil, err
	}
	s := &Server{Config: cfg, Data: data, Governor: gov}
	defer func() {
		if err != nil { // undo what was opened, in reverse
			if s.stopCache != nil {
				close(s.stopCache)
			}
			if s.hooks != nil {
				s.hooks.Close()
				<-s.hooksDone
			}
			gov.Close()
			data.Close()
		}
	}()
	s.Pipeline = &pipeline.Pipeline{
		Repos:    data.Repos,
		Access:   data.Access,
		Runner:   &gitexec.Runner{IdleTimeout: cfg.IdleTimeout},
		Governor: gov,
		Log:      cfg.Log,
		Limiter: &limiter.Limiter{
			Global:   cfg.MaxPackJobs,
			PerRepo:  cfg.MaxPackJobsPerRepo,
			MaxQueue: cfg.MaxQueue,
			MaxWait:  cfg.MaxQueueWait,
		},
		Pushes: &limiter.Limiter{Global: cfg.MaxPushJobs, PerClient: cfg.MaxPushesPerUser, What: "pushes",
			MaxQueue: cfg.MaxQueue, MaxWait: cfg.MaxQueueWait},
		MaxPushRefs:  cfg.MaxPushRefs,
		MaxPushBytes: cfg.MaxPushBytes,
		FsckPushes:   cfg.FsckPushes,
		HooksDir:     filepath.Join(data.Dir, "run", "hooks"),
		TempDir:      filepath.Join(data.Dir, "tmp"),
		Spool:        &pipeline.Spool{Max: cfg.MaxSpooledBytes, MaxPerAddr: cfg.MaxSpooledBytesPerAddr},
		RequestPace:  requestPace(cfg),

		MaxPerClient: cfg.MaxRequestsPerClient,
		ObjectInfo:   cfg.ObjectInfo,
		BundleURIs:   cfg.BundleURIs,
		PublicURL:    cfg.BundleBaseURL,
	}
	if !cfg.AllowUnreachableWants {
		s.Pipeline.Reach = &reach.Checker{}
		if cfg.BundleURIs && (cfg.HTTPAddr != "" || cfg.BundleBaseURL != "") {
			// Every reader may download the bundle (served over HTTP, or
			// published at the base URL): haves of its objects need no git.
			s.Pipeline.Reach.Bundle = maintain.BundleFile
		}
	}
	// Ref locks left by a git killed with the server (kill -9 mid-push)
	// would make every later update of those refs fail. After a hand
	// over they are the previous process's running pushes': kept.
	if repos, lerr := data.Repos.List(); lerr == nil && !cfg.HandedOver {
		for _, r := range repos {
			if n, err := repo.RemoveStaleLocks(r, startTime); err != nil {
				cfg.Log.Warn("removing stale ref locks", "repo", r.Name, "error", err.Error())
			} else if n > 0 {
				cfg.Log.Info("removed ref locks left by a killed git", "repo", r.Name, "locks", n)
			}
		}
	}
	// Request bodies left by a crash are of no use (after a hand over,
	// they are the previous process's requests).
	if !cfg.HandedOver {
		os.RemoveAll(s.Pipeline.TempDir)
	}
	if err = os.MkdirAll(s.Pipeline.TempDir, 0o700); err != nil {
		return nil, fmt.Errorf("data directory: %w", err)
	}
	// receive-pack's proc-receive hook is this binary (internal/pushguard).
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("cannot find this binary for git's hooks: %w", err)
	}
	if err = pushguard.InstallHook(s.Pipeline.HooksDir, exe); err != nil {
		return nil, fmt.Errorf("hooks directory: %w", err)
	}
	s.Maintainer = maintain.New(maintain.Options{Log: cfg.Log, Record: gov.RecordMaintenance, NoBundle: !cfg.BundleURIs,
		QuarantineAge: maintain.QuarantineAge(cfg.IdleTimeout)})
	s.openOutgoing()
	switch {
	case cfg.LFS && cfg.Node != "" && cfg.LFSStore == "":
		// Every node must serve every object: a node's own disk cannot.
		s.lfsOff = lfs.ClusterNeedsStore(cfg.Node)
		cfg.Log.Warn(s.lfsOff)
	case cfg.LFS:
		sharedIndex := "" // a cluster's nodes share the index in PostgreSQL
		if cfg.Node != "" {
			sharedIndex = cfg.Database
		}
		if s.LFS, err = lfs.OpenStore(ctx, data.Dir, cfg.LFSStore, sharedIndex); err != nil {
			return nil, err
		}
		s.LFS.Database = sharedIndex
		s.LFS.Repos, s.LFS.Access, s.LFS.Governor, s.LFS.Log = data.Repos, data.Access, gov, cfg.Log
		s.LFS.MaxObjectBytes = cfg.MaxLFSObjectBytes
		s.Pipeline.LFSBytes = func(ctx context.Context, repoName string) (int64, error) {
			_, bytes, err := s.LFS.Index.Usage(ctx, repoName)
			return bytes, err
		}
		if cfg.LFSRequireObjects {
			if err = pushguard.InstallHookAs(s.Pipeline.HooksDir, lfs.HookName, exe); err != nil {
				return nil, fmt.Errorf("hooks directory: %w", err)
			}
			s.Pipeline.LFS = s.LFS
		}
	}
	if cfg.Node != "" {
		if err = s.openCluster(ctx); err != nil {
			return nil, err
		}
	}
	gov.RegisterGauge("packwire_requests_in_flight", "Git processes running now.", func() float64 { return float64(s.Pipeline.InFlight()) })
	gov.RegisterGauge("packwire_pack_jobs_queued", "Requests waiting for a pack generation slot.", func() float64 { _, q := s.Pipeline.Limiter.Stats(); return float64(q) })
	if cfg.PackCache || cfg.FetchCache {
		// Part of every cache key: a new git may answer differently.
		var version []byte
		if version, err = exec.Command("git", "version").Output(); err != nil {
			return nil, fmt.Errorf("caches: git version: %w", err)
		}
		gitVersion := strings.TrimSpace(string(version))
		if cfg.PackCache {
			if err = s.openPackCache(gitVersion); err != nil {
				return nil, err
			}
		}
		if cfg.FetchCache {
			if err = s.openFetchCache(gitVersion); err != nil {
				return nil, err
			}
		}
		s.stopCache = make(chan struct{})
		go s.expireCaches(s.stopCache)
	}
	if cfg.SSHAddr != "" {
		if s.HostKeys, err = data.HostKeys(); err != nil {
			return nil, err
		}
		s.HostKey = s.HostKeys[0]
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
	inherited := maps.Clone(cfg.Listeners)
	s.listeners = map[string]net.Listener{}
	listen := func(addr, what, name string) (net.Listener, error) {
		l := takeInherited(inherited, name, addr)
		if l == nil {
			var err error
			if l, err = net.Listen("tcp", addr); err != nil {
				return nil, fmt.Errorf("%s listener: %w", what, err)
			}
		}
		listeners = append(listeners, l)
		s.listeners[name] = l
		return l, nil
	}
	defer func() {
		for name, l := range inherited { // handed to no transport
			cfg.Log.Warn("inherited socket not used: no transport of that name is on", "name", name, "address", l.Addr().String())
			l.Close()
		}
	}()

	var gitL, httpL, sshL net.Listener
	// One account per address for every listener: an address that
	// misbehaves over git:// is refused over SSH and HTTP too.
	s.Penalties = accept.NewPenalties(cfg.PenaltyMin, cfg.PenaltyMax, cfg.TrustedProxies.Contains, cfg.Log.With("component", "penalties"))
	var err error
	if cfg.GitAddr != "" {
		if gitL, err = listen(cfg.GitAddr, "git://", "git"); err != nil {
			return fail(err)
		}
	}
	if cfg.HTTPAddr != "" {
		if httpL, err = listen(cfg.HTTPAddr, "http", "http"); err != nil {
			return fail(err)
		}
		var tlsConfig *tls.Config
		if cfg.TLSCert != "" || cfg.TLSKey != "" {
			cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
			if err != nil {
				return fail(fmt.Errorf("TLS: %w", err))
			}
			tlsConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
		}
		// The cap sits under TLS: net/http must see the *tls.Conn (HTTP/2,
		// r.TLS), and a refused connection never reaches it.
		capped := accept.NewListener(httpL, cfg.MaxConnections, func(c net.Conn, msg string) {
			httptransport.RefuseConnection(c, tlsConfig, msg)
		}, cfg.Log.With("transport", "http"))
		capped.Startups = s.startups()
		capped.Penalties = s.Penalties
		httpL = capped
		if tlsConfig != nil {
			httpL = tls.NewListener(httpL, tlsConfig)
		}
	}
	if cfg.SSHAddr != "" {
		if sshL, err = listen(cfg.SSHAddr, "ssh", "ssh"); err != nil {
			return fail(err)
		}
	}
	var metricsL net.Listener
	if cfg.MetricsAddr != "" {
		if metricsL, err = listen(cfg.MetricsAddr, "metrics", "metrics"); err != nil {
			return fail(err)
		}
	}
	build := buildinfo.Get()
	s.Governor.Start(governor.Options{MaxAge: cfg.RecordsMaxAge, MaxRows: cfg.RecordsMaxCount, FlushInterval: cfg.RecordsFlush, Log: cfg.Log, Node: cfg.Node, Version: build.Version})
	s.Governor.RegisterInfo("packwire_build_info", "The packwire build serving: module version, VCS revision, Go version; always 1.",
		map[string]string{"version": build.Version, "revision": build.Revision, "goversion": build.GoVersion})

	if gitL != nil {
		s.GitAddr = gitL.Addr()
		s.daemon = &daemon.Server{Pipeline: s.Pipeline, InitTimeout: cfg.InitTimeout, MaxConnections: cfg.MaxConnections,
			Startups: s.startups(), Penalties: s.Penalties, Log: cfg.Log}
		s.serve("git://", func() error { return s.daemon.Serve(gitL) }, daemon.ErrServerClosed)
	}
	if httpL != nil {
		s.HTTPAddr = httpL.Addr()
		labDir := cfg.LabDir
		if labDir == "" {
			labDir = filepath.Join(s.Data.Dir, "lab")
		}
		s.Dashboard = &dashboard.Handler{
			Access:     s.Data.Access,
			Pipeline:   s.Pipeline,
			Governor:   s.Governor,
			PackCache:  s.Pipeline.PackCache,
			FetchCache: s.Pipeline.FetchCache,
			Repos:      s.Data.Repos,
			LabDir:     labDir,
			Log:        cfg.Log,
		}
		if gitL != nil {
			s.Dashboard.GitAddr = gitL.Addr()
		}
		if s.LFS != nil {
			s.Dashboard.LFS = s.LFS.Index
		}
		if s.Node != nil {
			s.Dashboard.ClusterStatus = func(ctx context.Context) (cluster.Status, error) {
				return cluster.ReadStatus(ctx, s.Data.Store.DB, s.Node.NodeTimeout())
			}
		}
		if sshL != nil {
			s.Dashboard.SSHAddr = sshL.Addr()
		}
		git := &httptransport.Handler{
			Pipeline:       s.Pipeline,
			Access:         s.Data.Access,
			MaxRequestBody: cfg.MaxRequestBody,
			Log:            cfg.Log,
		}
		if s.Pipeline.PublicURL == "" && cfg.BundleURIs {
			s.Pipeline.ListenerURL = "http://" + reachableAddr(httpL.Addr())
			if cfg.TLSCert != "" {
				s.Pipeline.ListenerURL = "https://" + reachableAddr(httpL.Addr())
			}
		}
		if s.lfsOff != "" {
			git.LFS = lfs.Refuse(s.lfsOff)
		}
		if s.LFS != nil {
			git.LFS = s.LFS
			s.LFS.HTTPURL = cfg.LFSURL
			if s.LFS.HTTPURL == "" {
				scheme := "http"
				if cfg.TLSCert != "" {
					scheme = "https"
				}
				s.LFS.HTTPURL = scheme + "://" + reachableAddr(httpL.Addr())
			}
		}
		routes := map[string]nethttp.Handler{"/api/v1/requests": s.Governor.APIHandler(s.adminOnly)}
		if metricsL == nil {
			routes["/metrics"] = s.Governor.MetricsHandler()
			if !cfg.MetricsPublic {
				routes["/metrics"] = s.metricsAuth(routes["/metrics"])
			}
		}
		handler := exactRoutes(routes, dashboardPrefix(s.Dashboard, git))
		if s.Router != nil { // a POST, which exactRoutes leaves to git
			relay, next := route.Handler(s.Pipeline, s.Data.Access), handler
			replicate := route.ReplicateHandler(s.Data.Repos, s.Data.Access, cfg.MaxPushRefs)
			s.replicator = replicate
			ping := route.PingHandler()
			handler = nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) {
				switch r.URL.Path {
				case route.RelayPath:
					relay.ServeHTTP(w, r)
					return
				case route.ReplicatePath:
					replicate.ServeHTTP(w, r)
					return
				case route.MirrorPath:
					s.mirrorCalls.ServeHTTP(w, r)
					return
				case route.PingPath:
					ping.ServeHTTP(w, r)
					return
				}
				next.ServeHTTP(w, r)
			})
		}
		if len(cfg.TrustedProxies) > 0 {
			handler = cfg.TrustedProxies.Handler(handler)
		}
		handler = startedHandler(handler)
		s.httpDrain = httpdrain.New()
		s.httpServing = s.httpDrain.Listener(httpL)
		s.http = &nethttp.Server{
			Handler:           s.httpDrain.Handler(handler),
			ConnState:         s.httpDrain.ConnState,
			ConnContext:       accept.ConnContext,
			ReadHeaderTimeout: cfg.InitTimeout,
			IdleTimeout:       cfg.IdleTimeout,
			MaxHeaderBytes:    64 << 10,
			ErrorLog:          slog.NewLogLogger(cfg.Log.Handler(), slog.LevelWarn),
		}
		s.serve("http", func() error { return s.http.Serve(s.httpServing) }, nethttp.ErrServerClosed)
	}
	if metricsL != nil {
		s.MetricsAddr = metricsL.Addr()
		s.metrics = &nethttp.Server{Handler: exactRoutes(map[string]nethttp.Handler{"/metrics": s.Governor.MetricsHandler()}, nethttp.NotFoundHandler()), ReadHeaderTimeout: cfg.InitTimeout}
		s.serve("metrics", func() error { return s.metrics.Serve(metricsL) }, nethttp.ErrServerClosed)
	}
	if cfg.MaintainInterval > 0 {
		sched := &maintain.Scheduler{M: s.Maintainer, Repos: s.Data.Repos.List, Interval: cfg.MaintainInterval,
			Concurrency: cfg.MaintainConcurrency, Budget: cfg.MaintainBudget, Sweep: func(ctx context.Context) {
				s.expireTrash(ctx)
				s.sweepLFS(ctx)
				s.expireTokens(ctx)
			}}
		ctx, cancel := context.WithCancel(context.Background())
		s.stopMaintain = cancel
		s.wg.Add(1)
		go func() { defer s.wg.Done(); sched.Run(ctx) }()
	}
	s.startOutgoing()
	if sshL != nil {
		s.SSHAddr = sshL.Addr()
	}
	if err := s.startCluster(); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	if sshL != nil {
		s.SSHAddr = sshL.Addr()
		s.ssh = &sshtransport.Server{
			Pipeline:       s.Pipeline,
			Access:         s.Data.Access,
			HostKeys:       s.HostKeys,
			Ciphers:        cfg.SSHCiphers,
			InitTimeout:    cfg.InitTimeout,
			KeepAlive:      cfg.SSHKeepAlive,
			IdleTimeout:    cfg.SSHIdleTimeout,
			MaxConnections: cfg.MaxConnections,
			Startups:       s.startups(),
			Penalties:      s.Penalties,
			MaxSessions:    cfg.SSHMaxSessions,
			MaxUnacked:     cmp.Or(cfg.SSHMaxUnacked, -1), // the flag's 0 is off
			Log:            cfg.Log,
		}
		if s.LFS != nil {
			s.ssh.LFS = s.LFS
		}
		s.serve("ssh", func() error { return s.ssh.Serve(sshL) }, sshtransport.ErrServerClosed)
	}
	return nil
}

// startups is a listener's bound per address on connections that have
// not sent their request yet (each listener has its own, as each has its
// own MaxConnections).
func (s *Server) startups() *accept.Startups {
	perAddress := s.Config.MaxStartupsPerAddress
	if perAddress == 0 && s.Config.MaxConnections > 0 {
		perAddress = max(10, s.Config.MaxConnections/8)
	}
	return accept.NewStartups(perAddress, s.Config.TrustedProxies.Contains)
}

// startedHandler tells the HTTP listener that a connection's request has
// arrived whole: it no longer counts among its address's startups.
func startedHandler(next nethttp.Handler) nethttp.Handler {
	return nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) {
		accept.Started(r.Context())
		next.ServeHTTP(w, r)
	})
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

// openPackCache prepares the shared pack generation: the cache directory,
// the unix socket its hook talks to, and the hook command for upload-pack.
func (s *Server) openPackCache(gitVersion string) error {
	cfg := s.Config
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("pack cache: cannot find this binary for the hook: %w", err)
	}
	cache := &packcache.Cache{
		Dir:          s.cacheDir("packs"),
		MaxBytes:     cfg.PackCacheMaxBytes,
		MaxAge:       cfg.PackCacheMaxAge,
		MinUses:      cfg.PackCacheMinUses,
		MinFreeBytes: cfg.PackCacheMinFreeBytes,
		GitVersion:   gitVersion,
		Log:          cfg.Log,
	}
	if err := cache.Open(); err != nil {
		return fmt.Errorf("pack cache: %w", err)
	}
	sock := filepath.Join(s.Data.Dir, "run", "pack.sock")
	if len(sock) > 100 { // sun_path holds 108 bytes
		sum := sha256.Sum256([]byte(s.Data.Dir))
		sock = filepath.Join(os.TempDir(), "packwire-"+hex.EncodeToString(sum[:6])+".sock")
	}
	os.MkdirAll(filepath.Dir(sock), 0o700)
	os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("pack cache socket: %w", err)
	}
	s.hooks = l
	s.hooksSock, _ = os.Stat(sock)
	s.hooksDone = make(chan struct{})
	go func() {
		defer close(s.hooksDone)
		cache.ServeHooks(l)
	}()
	s.Governor.RegisterGauge("packwire_pack_cache_bytes", "Finished packs kept for reuse, in bytes.", func() float64 { _, b, _ := cache.Stats(); return float64(b) })
	s.Governor.RegisterGauge("packwire_pack_cache_runs", "Shared pack-objects runs in progress.", func() float64 { _, _, n := cache.Stats(); return float64(n) })
	s.Pipeline.PackCache = cache
	s.Pipeline.HookExecutable = exe
	s.Pipeline.HookSocket = sock
	return nil
}

// cacheDir is this process's directory for a cache's files,
// DATA/cache/KIND/PID: a process that took over from another must not
// clear the files the other still replays. Those of processes that no
// longer run are removed.
func (s *Server) cacheDir(kind string) string {
	parent := filepath.Join(s.Data.Dir, "cache", kind)
	entries, _ := os.ReadDir(parent)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !handover.Alive(pid) || pid == os.Getpid() {
			os.RemoveAll(filepath.Join(parent, e.Name())) // older layouts' files too
		}
	}
	return filepath.Join(parent, strconv.Itoa(os.Getpid()))
}

// openFetchCache prepares the store of whole fetch responses under
// DATA/cache/fetch.
func (s *Server) openFetchCache(gitVersion string) error {
	cfg := s.Config
	cache := &fetchcache.Cache{
		Dir:          s.cacheDir("fetch"),
		MaxBytes:     cfg.FetchCacheMaxBytes,
		MaxAge:       cfg.FetchCacheMaxAge,
		MinFreeBytes: cfg.FetchCacheMinFreeBytes,
		GitVersion:   gitVersion,
		Log:          cfg.Log,

		SightingWindow: cfg.FetchCacheSightingWindow,
	}
	if err := cache.Open(); err != nil {
		return err
	}
	s.Governor.RegisterGauge("packwire_fetch_cache_bytes", "Whole fetch responses kept for replay, in bytes.", func() float64 { return float64(cache.Stats().Bytes) })
	s.Governor.RegisterGauge("packwire_fetch_cache_entries", "Whole fetch responses kept for replay.", func() float64 { return float64(cache.Stats().Entries) })
	s.Governor.RegisterGauge("packwire_fetch_cache_runs", "git runs whose output is being shared with identical fetches.", func() float64 { return float64(cache.Stats().Runs) })
	s.Pipeline.FetchCache = cache
	return nil
}

// expireCaches drops entries past their age once a minute until stop.
func (s *Server) expireCaches(stop <-chan struct{}) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			if c := s.Pipeline.PackCache; c != nil {
				c.Expire()
			}
			if c := s.Pipeline.FetchCache; c != nil {
				c.Expire()
			}
		}
	}
}

// adminOnly authorizes the lab's API: an HTTP token of a server admin (a
// user with the admin role on "**"). It returns 0 or the refusal status.
func (s *Server) adminOnly(r *nethttp.Request) int {
	user, token, ok := r.BasicAuth()
	if !ok {
		return nethttp.StatusUnauthorized
	}
	p, err := s.Data.Access.PrincipalForToken(r.Context(), user, token)
	if err != nil {
		return nethttp.StatusUnauthorized
	}
	if !s.Data.Access.IsServerAdmin(r.Context(), p) {
		return nethttp.StatusForbidden
	}
	return 0
}

// metricsAuth lets through a request with a token that may read /metrics
// (scoped to metrics, or a server admin's), sent as Prometheus does: HTTP
// Basic, or "Authorization: Bearer TOKEN".
func (s *Server) metricsAuth(next nethttp.Handler) nethttp.Handler {
	return nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) {
		user, token, ok := r.BasicAuth()
		if bearer, found := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); found {
			user, token, ok = "", strings.TrimSpace(bearer), true
		}
		if !ok {
			w.Header().Set("WWW-Authenticate", `Basic realm="packwire metrics", charset="UTF-8"`)
			nethttp.Error(w, "metrics need a token: packwire token create USER --scope metrics (or --metrics-public)", nethttp.StatusUnauthorized)
			return
		}
		allowed, err := s.Data.Access.MayReadMetrics(r.Context(), user, token)
		switch {
		case err != nil:
			w.Header().Set("WWW-Authenticate", `Basic realm="packwire metrics", charset="UTF-8"`)
			nethttp.Error(w, "invalid credentials", nethttp.StatusUnauthorized)
		case !allowed:
			nethttp.Error(w, "this token may not read metrics: use a token created with --scope metrics, or a server admin's", nethttp.StatusForbidden)
		default:
			next.ServeHTTP(w, r)
		}
	})
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

// HostKeyFingerprint is the SHA256 fingerprint of the ed25519 SSH host key,
// the one OpenSSH clients choose first.
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
	defer s.Penalties.Close() // after the listeners: none is held anew
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
	if s.hooks != nil {
		// Running fetches are done: no hook is left to serve.
		s.hooks.Close()
		<-s.hooksDone
		// After a hand over the path is the next process's socket.
		if now, err := os.Stat(s.Pipeline.HookSocket); err == nil && s.hooksSock != nil && os.SameFile(now, s.hooksSock) {
			os.Remove(s.Pipeline.HookSocket)
		}
	}
	if s.stopCache != nil {
		close(s.stopCache)
		s.stopCache = nil
	}
	if s.stopMaintain != nil {
		s.stopMaintain() // a maintenance run in progress is killed; the layout stays servable
	}
	if s.stopNode != nil {
		s.stopNode() // stops heartbeating: the other nodes see this one unhealthy
	}
	if s.replicator != nil {
		s.replicator.Close() // the git processes started for replications to come
	}
	if s.stopOutgoing != nil {
		s.stopOutgoing() // attempts in flight are cut and stay pending for the next start
	}
	s.wg.Wait()
	if s.Node != nil && s.Node.Membership != nil {
		s.Node.Membership.Close()
	}
	s.Governor.Close()
	if s.LFS != nil {
		s.LFS.Close()
	}
	s.Data.Close()
	// This process's cache files (cacheDir): nothing replays them now.
	if c := s.Pipeline.FetchCache; c != nil {
		os.RemoveAll(c.Dir)
	}
	if c := s.Pipeline.PackCache; c != nil {
		os.RemoveAll(c.Dir)
	}
	s.errMu.Lock()
	defer s.errMu.Unlock()
	return errors.Join(drainErr, s.err)
}

// dashboardPrefix sends every path under /-/ to the dashboard, whatever the
// method (it answers 404 or 405 itself), and the rest to git. No repository
// name starts with "-" (repo.CleanName), so none is shadowed.
func dashboardPrefix(d nethttp.Handler, git nethttp.Handler) nethttp.Handler {
	return nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) {
		switch {
		case strings.HasPrefix(r.URL.Path, dashboard.Prefix):
			d.ServeHTTP(w, r)
		case r.URL.Path == "/-":
			nethttp.Redirect(w, r, dashboard.Prefix, nethttp.StatusMovedPermanently)
		default:
			git.ServeHTTP(w, r)
		}
	})
}

// reachableAddr is a listener's address as a client can dial it: an
// unspecified IP (":8080") becomes this host's name.
func reachableAddr(a net.Addr) string {
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		if name, err := os.Hostname(); err == nil {
			host = name
		}
	}
	return net.JoinHostPort(host, port)
}
