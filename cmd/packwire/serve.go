package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"packwire/internal/buildinfo"
	"packwire/internal/datadir"
	"packwire/internal/handover"
	"packwire/internal/server"
	"packwire/internal/transport/forwarded"
	sshtransport "packwire/internal/transport/ssh"
)

// parseServe reads serve's flags and --config file into a server
// configuration and the shutdown grace period.
func parseServe(args []string, stderr io.Writer) (server.Config, time.Duration, error) {
	d := server.Defaults
	fs := newFlagSet("serve", "serve [--config FILE] [FLAGS]", `Serve every bare repository under DATA/repos over git://, smart HTTP and SSH.
The data directory is created on first start, with its SQLite store and SSH
host keys that persist (ed25519, ECDSA P-256, RSA 3072; an older data
directory gains the keys it lacks). An empty address turns a transport off.
SIGINT or SIGTERM stops accepting, lets running requests finish within --grace,
then exits 0. SIGHUP re-reads --config and the flags: limits, timeouts and
cache bounds apply at once, in this process; a replaced binary or other changed
settings hand the listening sockets over to a new process, as SIGUSR2 (packwire
upgrade) always does, refusing and cutting no connection. Sockets passed by
systemd (LISTEN_FDS) are used, matched by name (git, http, ssh, metrics) or
port. See docs/restarts.md.

--config FILE (default $PACKWIRE_CONFIG) reads flags from a TOML file whose
keys are the flag names without "--": max-pack-jobs = 8, http = ":8080",
timeout = "10m", fetch-cache = false, trusted-proxies = ["10.0.0.0/8"].
Flags on the command line override the file; an unknown key or a value of
the wrong type is an error naming its line. Durations take days too (30d).
Every count, size, rate and duration is 0 or more, and --ssh-ciphers names
known ciphers: a value out of range, on the command line or in the file,
stops serve with exit status 2, naming the flag or key and the range.`, stderr)
	cfg := d
	configFile := fs.String("config", os.Getenv(envConfig), "read flags from this TOML file (keys: the flag names); the command line overrides it")
	fs.StringVar(&cfg.DataDir, "data", datadir.Dir(), "data directory, created on first start ($PACKWIRE_DATA sets the default)")
	fs.StringVar(&cfg.Database, "database", datadir.Database(), "keep the store and the request records in PostgreSQL (postgres://USER@HOST/DB) instead of the SQLite files in --data ($"+datadir.EnvDatabase+" sets the default)")
	fs.IntVar(&cfg.DatabaseMaxConns, "database-max-conns", d.DatabaseMaxConns, "with a postgres:// --database: connections the store's pool opens at most; the server opens up to 5 more\n(sizing PostgreSQL: docs/clusters.md)")
	fs.StringVar(&cfg.Node, "node", "", "join the cluster of the --database store as this node (a short name); needs --http (docs/clusters.md)")
	fs.StringVar(&cfg.NodeURL, "node-url", "", "with --node: the URL other nodes reach this one at (default: http://the --http address)")
	fs.DurationVar(&cfg.NodeHeartbeat, "node-heartbeat", d.NodeHeartbeat, "with --node: time between heartbeats (and failover checks)")
	fs.DurationVar(&cfg.NodeTimeout, "node-timeout", d.NodeTimeout, "with --node: a node whose last heartbeat is older is unhealthy; its repositories' primaries move")
	fs.StringVar(&cfg.GitAddr, "git", d.GitAddr, "git:// listen address (empty: off)")
	fs.StringVar(&cfg.HTTPAddr, "http", d.HTTPAddr, "smart HTTP listen address (empty: off)")
	fs.StringVar(&cfg.SSHAddr, "ssh", d.SSHAddr, "SSH listen address (empty: off)")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "serve HTTPS with this certificate (PEM), with --tls-key")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "private key for --tls-cert (PEM)")
	trusted := fs.String("trusted-proxies", "", "reverse proxies (comma-separated addresses or CIDR prefixes) whose X-Forwarded-For and X-Forwarded-Proto\nare believed; from any other peer they are ignored (default: none)")
	fs.DurationVar(&cfg.InitTimeout, "init-timeout", d.InitTimeout, "time a client has to send its request (git:// request line, SSH handshake, HTTP headers)")
	fs.DurationVar(&cfg.IdleTimeout, "timeout", d.IdleTimeout, "end a request when no data moved either way for this long (0: never)")
	fs.IntVar(&cfg.MaxConnections, "max-connections", d.MaxConnections, "concurrent connections per git://, SSH and HTTP listener; more are refused (\"server busy\") and logged (0: no limit)")
	fs.IntVar(&cfg.MaxStartupsPerAddress, "max-startups-per-address", d.MaxStartupsPerAddress, "connections per client address and listener that have not sent a whole request yet, as OpenSSH's\nPerSourceMaxStartups; trusted proxies are not bounded (0: an eighth of --max-connections, at least 10)")
	fs.DurationVar(&cfg.PenaltyMax, "penalty-max", d.PenaltyMax, "longest an address that keeps misbehaving (malformed requests, failed or unfinished handshakes) is\nrefused at accept, as OpenSSH's PerSourcePenalties; trusted proxies are exempt (0: off; docs/limits.md)")
	fs.DurationVar(&cfg.PenaltyMin, "penalty-min", d.PenaltyMin, "penalty an address must run up before it is refused (a malformed request adds 2s, an idle\nconnection 10s; it runs down in real time)")
	fs.Int64Var(&cfg.MaxRequestBody, "max-request-body", d.MaxRequestBody, "bound on an HTTP fetch request body after gzip decoding, in bytes (HTTP 413 past it)")
	fs.Int64Var(&cfg.MaxSpooledBytes, "max-spooled-bytes", d.MaxSpooledBytes, "bytes of fetch request bodies over 1 MiB held in DATA/tmp at once, all clients together; more are\nrefused with \"server busy\" (0: no bound)")
	fs.Int64Var(&cfg.MaxSpooledBytesPerAddr, "max-spooled-bytes-per-address", d.MaxSpooledBytesPerAddr, "... per client address, in bytes (0: no bound)")
	ciphers := fs.String("ssh-ciphers", "", "SSH ciphers offered, comma-separated, in order of preference (default: AES-GCM and AES-CTR, not\nchacha20-poly1305); within 5 ms round trip the server's order decides, else the client's: docs/configuration.md#ssh")
	fs.DurationVar(&cfg.SSHKeepAlive, "ssh-keepalive", d.SSHKeepAlive, "interval of SSH keepalive probes; 3 unanswered close a connection with no command running (0: off)")
	fs.DurationVar(&cfg.SSHIdleTimeout, "ssh-idle-timeout", d.SSHIdleTimeout, "close an SSH connection once no command ran for this long after its last one (0: never; before the\nfirst command, --init-timeout applies)")
	fs.IntVar(&cfg.SSHMaxSessions, "ssh-max-sessions", d.SSHMaxSessions, "session channels open at once per SSH connection, as OpenSSH's MaxSessions; more are refused (resource shortage), logged once per connection (0: no limit)")
	sizeVar(fs, &cfg.SSHMaxUnacked, "ssh-max-unacked", d.SSHMaxUnacked, "bytes of a command's output an SSH client may hold that git has not read yet, a size (512K, 1M), at\nleast 256K (0: off, the client's whole window; why: docs/configuration.md#ssh)")
	fs.IntVar(&cfg.MaxPackJobs, "max-pack-jobs", d.MaxPackJobs, "concurrent fetches/archives that may generate packs, in all (0: no limit); more wait in the queue")
	fs.IntVar(&cfg.MaxPackJobsPerRepo, "max-pack-jobs-per-repo", d.MaxPackJobsPerRepo, "... per repository (0: no limit), so one repo's clone storm cannot starve the others")
	fs.IntVar(&cfg.MaxQueue, "max-queue", d.MaxQueue, "requests waiting for a slot; more are refused at once with \"server busy\"")
	fs.DurationVar(&cfg.MaxQueueWait, "max-queue-wait", d.MaxQueueWait, "a queued request is refused with \"server busy ... retry in Ns\" after this long")
	fs.IntVar(&cfg.MaxPushJobs, "max-push-jobs", d.MaxPushJobs, "concurrent pushes that write (receive-pack running), in all (0: no limit); more wait in the queue, then are refused ref by ref with \"server busy\"")
	fs.IntVar(&cfg.MaxPushesPerUser, "max-pushes-per-user", d.MaxPushesPerUser, "concurrent pushes that write one user may run; more are refused with \"server busy: too many pushes\nrunning\" (0: no limit)")
	fs.Int64Var(&cfg.MaxPushBytes, "max-push-bytes", d.MaxPushBytes, "bound on the pack one push may send, in bytes (git's receive.maxInputSize); a repository's quota may\nbound it further (0: none)")
	fs.BoolVar(&cfg.FsckPushes, "fsck-pushes", d.FsckPushes, "git checks every pushed object (receive.fsckObjects); a malformed one is refused with git's message and\nnothing is written")
	fs.IntVar(&cfg.MaxPushRefs, "max-push-refs", d.MaxPushRefs, "ref updates one push may carry; a larger push is refused as it is read (\"too many ref updates in one push\")")
	fs.Int64Var(&cfg.RequestMinRate, "request-min-rate", d.RequestMinRate, "bytes/s a fetch request or a push's commands must average after --init-timeout, and a push's pack from\nits first byte; slower is refused (\"request too slow\", HTTP 408) (0: no bound)")
	fs.DurationVar(&cfg.RequestTimeout, "request-timeout", d.RequestTimeout, "time a fetch request (or a stretch of v0/v1 negotiation) may take to arrive whole (0: no bound)")
	fs.BoolVar(&cfg.AllowUnreachableWants, "allow-unreachable-wants", d.AllowUnreachableWants, "serve any object a client asks for by id, reachable from a visible ref or not, as git's protocol v2\ndoes; off: such wants are refused (\"not our ref\") (docs/limits.md)")
	fs.BoolVar(&cfg.ObjectInfo, "object-info", d.ObjectInfo, "serve protocol v2's object-info command (any object's size by id, reachable or not); off: not\nadvertised, and refused")
	fs.BoolVar(&cfg.BundleURIs, "bundle-uris", d.BundleURIs, "keep a clone bundle beside each maintained repository's preferred pack (a copy of its bytes), serve it at\n/NAME.git/bundle over HTTP and advertise it with protocol v2's bundle-uri command (docs/clone-fast-path.md)")
	fs.StringVar(&cfg.BundleBaseURL, "bundle-base-url", d.BundleBaseURL, "base URL bundle URIs point at (BASE/NAME.git/bundle): the HTTP listener as clients reach it, or a\nstatic copy or CDN (default: over HTTP the address the client used, else http:// and the HTTP listener's)")
	fs.BoolVar(&cfg.LFS, "lfs", d.LFS, "serve Git LFS: the batch, object and locks API under /NAME.git/info/lfs/, and git-lfs-transfer and\ngit-lfs-authenticate over SSH; objects in DATA/lfs or --lfs-store (docs/lfs.md)")
	fs.Int64Var(&cfg.MaxLFSObjectBytes, "max-lfs-object-bytes", d.MaxLFSObjectBytes, "bound on one LFS object, in bytes; a larger one is refused (HTTP 413) (0: none)")
	fs.BoolVar(&cfg.LFSRequireObjects, "lfs-require-objects", d.LFSRequireObjects, "refuse a push whose new commits add LFS pointers to objects the repository does not hold, naming\nthe first")
	fs.StringVar(&cfg.LFSStore, "lfs-store", d.LFSStore, "where LFS objects live: empty for DATA/lfs, or s3://BUCKET?endpoint=http(s)://HOST:PORT (credentials\nfrom AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY; downloads are pre-signed URLs; required on a cluster node)")
	fs.StringVar(&cfg.LFSURL, "lfs-url", d.LFSURL, "base URL (scheme://host:port) of the HTTP listener as clients reach it, for git-lfs-authenticate's\nhref (default: http:// and the HTTP listener's address)")
	fs.IntVar(&cfg.MaxRequestsPerClient, "max-requests-per-client", d.MaxRequestsPerClient, "requests (git processes) one user, or one anonymous address, may run at once; more are refused with\n\"server busy\" (0: no limit)")
	fs.BoolVar(&cfg.PackCache, "pack-cache", d.PackCache, "share identical pack-objects runs between concurrent fetches and reuse finished packs (when it pays\nbeside the fetch cache: docs/clone-storms.md)")
	fs.Int64Var(&cfg.PackCacheMaxBytes, "pack-cache-max-bytes", d.PackCacheMaxBytes, "finished packs kept on disk in total, in bytes, least recently used dropped first (0: share concurrent\nruns only)")
	fs.DurationVar(&cfg.PackCacheMaxAge, "pack-cache-max-age", d.PackCacheMaxAge, "how long a finished pack may be reused (0: until evicted)")
	fs.IntVar(&cfg.PackCacheMinUses, "pack-cache-min-uses", d.PackCacheMinUses, "keep a finished pack only once the same request was seen this many times")
	fs.Int64Var(&cfg.PackCacheMinFreeBytes, "pack-cache-min-free-bytes", d.PackCacheMinFreeBytes, "with less free disk than this, in bytes, run pack-objects directly instead of caching")
	fs.BoolVar(&cfg.FetchCache, "fetch-cache", d.FetchCache, "store whole fetch responses on every transport and protocol version and replay them to identical\nrequests without running git; identical requests during a run follow it (docs/clone-storms.md)")
	fs.Int64Var(&cfg.FetchCacheMaxBytes, "fetch-cache-max-bytes", d.FetchCacheMaxBytes, "stored fetch responses kept on disk in total, in bytes, least recently used dropped first (0: share\nruns in progress only)")
	fs.DurationVar(&cfg.FetchCacheMaxAge, "fetch-cache-max-age", d.FetchCacheMaxAge, "how long a stored fetch response may be replayed (0: until evicted or its refs change)")
	fs.Int64Var(&cfg.FetchCacheMinFreeBytes, "fetch-cache-min-free-bytes", d.FetchCacheMinFreeBytes, "with less free disk than this, in bytes, run git without the fetch cache")
	fs.DurationVar(&cfg.FetchCacheSightingWindow, "fetch-cache-sighting-window", d.FetchCacheSightingWindow, "store the response to a fetch with haves (or a recorded v0/v1 session) only if an identical one was\nseen this recently")
	fs.BoolVar(&cfg.MetricsPublic, "metrics-public", d.MetricsPublic, "serve /metrics on the HTTP listener to anyone; off, it needs a token created with --scope metrics or\na server admin's")
	fs.StringVar(&cfg.MetricsAddr, "metrics", "", "serve Prometheus /metrics on this separate address (default: on the HTTP listener)")
	fs.DurationVar(&cfg.RecordsMaxAge, "records-max-age", d.RecordsMaxAge, "keep request records this long (0: no age bound; in a cluster, every node's records)")
	fs.IntVar(&cfg.RecordsMaxCount, "records-max-count", d.RecordsMaxCount, "keep at most this many request records (0: no bound; in a cluster, of all nodes together)")
	fs.DurationVar(&cfg.MaintainInterval, "maintain-interval", d.MaintainInterval, "check every repository this often and run the maintenance it needs (see packwire maintain --help; 0: never)")
	fs.IntVar(&cfg.MaintainConcurrency, "maintain-concurrency", d.MaintainConcurrency, "repositories maintained at once")
	fs.DurationVar(&cfg.MaintainBudget, "maintain-budget", d.MaintainBudget, "maintenance CPU time allowed per hour, all repositories together (0: no bound)")
	fs.DurationVar(&cfg.TrashRetention, "trash-retention", d.TrashRetention, "keep deleted repositories (packwire repo delete) restorable this long; the maintenance scheduler removes older ones (0: keep them for good)")
	fs.StringVar(&cfg.LabDir, "lab-dir", "", "directory of the lab's reports the dashboard lists (default DATA/lab)")
	fs.IntVar(&cfg.DeliveryConcurrency, "delivery-concurrency", d.DeliveryConcurrency, "webhook and push mirror attempts in flight at once, one per hook or mirror at most (see packwire hook add --help)")
	fs.DurationVar(&cfg.HookTimeout, "hook-timeout", d.HookTimeout, "one webhook POST, the answer included; a slower receiver's attempt fails and is retried")
	fs.DurationVar(&cfg.MirrorPushTimeout, "mirror-push-timeout", d.MirrorPushTimeout, "one push to a push mirror")
	fs.DurationVar(&cfg.MirrorCheck, "mirror-check-interval", d.MirrorCheck, "how often read-only mirrors are checked for a due sync, each on its own --interval (0: never; packwire repo sync still syncs)")
	grace := fs.Duration("grace", 30*time.Second, "on SIGINT/SIGTERM or a hand over to a new process, time running requests get to finish before they are killed")
	logFormat := fs.String("log-format", "text", "log format: text or json (logs go to stderr)")
	// Every count, size and duration must be 0 or more: a value the server
	// cannot use is refused here, naming the flag or the file's key and
	// line, not met later as a server that refuses every client.
	checkFlags(fs, map[string]func(any) error{
		"database-max-conns": atLeast(1),
		"ssh-ciphers": func(v any) error {
			if v == "" {
				return nil
			}
			return sshtransport.CheckCiphers(strings.Split(v.(string), ","))
		},
	})
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return cfg, 0, err
	}
	if err := wantArgs(args, pos, 0, 0, "serve [--config FILE] [FLAGS] (no arguments besides flags)"); err != nil {
		return cfg, 0, err
	}
	if *configFile != "" {
		if err := applyConfig(fs, *configFile); err != nil {
			return cfg, 0, err
		}
	}
	if !flagSet(fs, "max-pushes-per-user") {
		cfg.MaxPushesPerUser = server.PushesPerUser(cfg.MaxPushJobs)
	}
	if cfg.TrustedProxies, err = forwarded.Parse(*trusted); err != nil {
		return cfg, 0, usagef("--trusted-proxies: %v", err)
	}
	if err := checkTLS(cfg.TLSCert, cfg.TLSKey); err != nil {
		return cfg, 0, err
	}
	if *ciphers != "" {
		cfg.SSHCiphers = strings.Split(*ciphers, ",")
	}
	switch *logFormat {
	case "text":
		cfg.Log = slog.New(slog.NewTextHandler(stderr, nil))
	case "json":
		cfg.Log = slog.New(slog.NewJSONHandler(stderr, nil))
	default:
		return cfg, 0, usagef("--log-format %s: text or json", *logFormat)
	}
	return cfg, *grace, nil
}

func cmdServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, grace, err := parseServe(args, stderr)
	if err != nil {
		return err
	}
	if err := server.CheckPlatform(); err != nil {
		return err // before anything is created on disk
	}
	if _, err := exec.LookPath("git"); err != nil {
		return fmt.Errorf("git is not installed or not on PATH: packwire serves through git's own upload-pack and receive-pack (install it, e.g. apt-get install git)")
	}

	inherited, from, err := handover.Inherited()
	if err != nil {
		return err
	}
	cfg.Listeners = inherited
	cfg.HandedOver = from == "packwire"
	// The binary as it is now, to tell on SIGHUP whether it was replaced.
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("cannot find this binary: %w", err)
	}
	exeInfo, _ := os.Stat(exe)

	// Signals are caught before the addresses are printed: a SIGINT sent
	// as soon as they appear must shut down gracefully, not kill.
	sigCtx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	reload := make(chan os.Signal, 1)
	signal.Notify(reload, syscall.SIGHUP, handover.UpgradeSignal)
	defer signal.Stop(reload)
	srv, err := server.New(ctx, cfg)
	if err != nil {
		return err
	}
	if err := srv.Start(); err != nil {
		srv.Data.Close()
		return err
	}
	printListening(stdout, srv, cfg)
	pidFile := handover.PIDFile(srv.Data.Dir)
	if err := handover.WritePID(pidFile); err != nil {
		cfg.Log.Warn("pid file not written: packwire upgrade cannot find this server", "file", pidFile, "error", err.Error())
	}
	defer handover.RemovePID(pidFile)
	if err := handover.Ready(); err != nil {
		cfg.Log.Warn("could not say ready", "error", err.Error())
	}
	if from != "" {
		cfg.Log.Info("serving on inherited sockets", "from", from, "sockets", len(inherited))
	}

	for {
		select {
		case <-sigCtx.Done():
			stop() // a second signal kills at once
			fmt.Fprintf(stdout, "packwire: shutting down, waiting up to %s for %d running requests\n", grace, srv.Pipeline.InFlight())
			shutdownCtx, cancel := context.WithTimeout(context.Background(), grace)
			defer cancel()
			if err := srv.Shutdown(shutdownCtx); err != nil {
				fmt.Fprintf(stderr, "packwire: shutdown: %v\n", err)
			}
			return nil
		case sig := <-reload:
			next := sig == handover.UpgradeSignal // packwire upgrade: always a new process
			if sig == syscall.SIGHUP {
				var err error
				if next, grace, err = reloadServe(srv, args, grace, exe, exeInfo, stderr); err != nil {
					cfg.Log.Error("configuration reload refused: nothing changed", "error", err.Error())
					continue
				}
			}
			if !next {
				continue
			}
			if err := handOver(srv, exe, grace, stdout); err != nil {
				cfg.Log.Error("hand over to a new process failed: this one keeps serving", "error", err.Error())
				continue
			}
			return nil
		}
	}
}

// handOverTimeout is how long a new process may take to open the data
// directory and say it serves before the old one gives up on it.
const handOverTimeout = 2 * time.Minute

// handOver starts exe as the next server on this one's sockets and, once
// it serves, finishes this one's requests within grace.
func handOver(srv *server.Server, exe string, grace time.Duration, stdout io.Writer) error {
	names, files, err := srv.ListenerFiles()
	if err != nil {
		return err
	}
	proc, err := handover.Exec(exe, os.Args[1:], names, files, handOverTimeout)
	for _, f := range files {
		f.Close()
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "packwire: pid %d serves now; pid %d finishes its %d running requests (up to %s)\n", proc.Pid, os.Getpid(), srv.Pipeline.InFlight(), grace)
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := srv.HandOver(ctx); err != nil {
		fmt.Fprintf(stdout, "packwire: pid %d: hand over: %v\n", os.Getpid(), err)
	}
	return nil
}

// reloadServe re-reads serve's flags and --config file (SIGHUP): limits,
// timeouts and cache bounds apply at once (server.Reload); other changed
// settings, or a binary replaced on disk,
// ask for a new process (next); settings only a stop and start can change
// refuse the whole reload.
func reloadServe(srv *server.Server, args []string, grace time.Duration, exe string, exeInfo os.FileInfo, stderr io.Writer) (next bool, _ time.Duration, _ error) {
	cfg, newGrace, err := parseServe(args, stderr)
	if err != nil {
		return false, grace, err
	}
	live, handOver, stopStart := srv.Changes(cfg)
	if len(stopStart) > 0 {
		return false, grace, fmt.Errorf("--%s: a new value needs packwire stopped and started", strings.Join(stopStart, ", --"))
	}
	log := srv.Config.Log
	if len(live) > 0 {
		srv.Reload(cfg)
		log.Info("configuration reloaded", "applied", strings.Join(live, ","))
	}
	if newGrace != grace {
		log.Info("configuration reloaded", "applied", "grace")
	}
	if now, err := os.Stat(exe); err == nil && exeInfo != nil && !sameBinary(now, exeInfo) {
		log.Info("the binary was replaced: handing over to a new process", "binary", exe)
		return true, newGrace, nil
	}
	if len(handOver) > 0 {
		log.Info("configuration changed: handing over to a new process", "settings", strings.Join(handOver, ","))
		return true, newGrace, nil
	}
	if len(live) == 0 && newGrace == grace {
		log.Info("configuration reloaded: nothing changed")
	}
	return false, newGrace, nil
}

// sameBinary: the file at the path is still the one this process was
// started from (same inode, size and time).
func sameBinary(a, b os.FileInfo) bool {
	return os.SameFile(a, b) && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime())
}

func printListening(stdout io.Writer, srv *server.Server, cfg server.Config) {
	fmt.Fprintf(stdout, "%s serving %s (pid %d)\n", buildinfo.Get(), srv.Data.Repos.Dir, os.Getpid())
	if srv.GitAddr != nil {
		fmt.Fprintf(stdout, "  git://   listening on %s\n", srv.GitAddr)
	}
	if srv.HTTPAddr != nil {
		scheme := "http://"
		if cfg.TLSCert != "" {
			scheme = "https://"
		}
		fmt.Fprintf(stdout, "  %-8s listening on %s\n", scheme, srv.HTTPAddr)
		fmt.Fprintf(stdout, "  dashboard at %s%s/-/ (log in with a server admin's token)\n", scheme, srv.HTTPAddr)
	}
	if srv.MetricsAddr != nil {
		fmt.Fprintf(stdout, "  metrics  listening on %s (/metrics)\n", srv.MetricsAddr)
	}
	if srv.SSHAddr != nil {
		fmt.Fprintf(stdout, "  ssh://   listening on %s, host key %s %s\n", srv.SSHAddr, srv.HostKey.PublicKey().Type(), srv.HostKeyFingerprint())
		for _, key := range srv.HostKeys[1:] {
			fmt.Fprintf(stdout, "           host key %s %s\n", key.PublicKey().Type(), gossh.FingerprintSHA256(key.PublicKey()))
		}
	}
}

// checkTLS wants both halves of a certificate or neither, and files that
// can be read, saying which one is wrong.
func checkTLS(cert, key string) error {
	switch {
	case cert != "" && key == "":
		return usagef("--tls-cert given without --tls-key")
	case key != "" && cert == "":
		return usagef("--tls-key given without --tls-cert")
	}
	for _, f := range []struct{ flag, path string }{{"tls-cert", cert}, {"tls-key", key}} {
		if f.path == "" {
			continue
		}
		fh, err := os.Open(f.path)
		if err != nil {
			return fmt.Errorf("--%s: %w", f.flag, err)
		}
		fh.Close()
	}
	return nil
}
