package server

import (
	"reflect"
	"slices"
	"strings"
	"time"
	"unicode"

	"packwire/internal/fetchcache"
	"packwire/internal/maintain"
	"packwire/internal/packcache"
	"packwire/internal/pipeline"
	"packwire/internal/store"
	sshtransport "packwire/internal/transport/ssh"
)

// liveSettings are the Config fields Reload applies to a running server,
// with their flag names: this is the one list of what a SIGHUP changes in
// place. stopSettings need a stop and a start (a next process inherits
// the sockets and the data directory as they are). Every other field is
// applied by handing over to a next process.
var (
	liveSettings = map[string]string{
		// Limits: running requests keep their slots.
		"MaxPackJobs": "max-pack-jobs", "MaxPackJobsPerRepo": "max-pack-jobs-per-repo",
		"MaxQueue": "max-queue", "MaxQueueWait": "max-queue-wait",
		"MaxPushJobs": "max-push-jobs", "MaxPushesPerUser": "max-pushes-per-user",
		"MaxSpooledBytes": "max-spooled-bytes", "MaxSpooledBytesPerAddr": "max-spooled-bytes-per-address",
		"MaxRequestsPerClient": "max-requests-per-client",
		// Timeouts: taken by each connection and request as it starts.
		"InitTimeout": "init-timeout", "IdleTimeout": "timeout",
		"RequestTimeout": "request-timeout", "RequestMinRate": "request-min-rate",
		"SSHKeepAlive": "ssh-keepalive", "SSHIdleTimeout": "ssh-idle-timeout",
		"HookTimeout": "hook-timeout", "MirrorPushTimeout": "mirror-push-timeout",
		// Cache bounds: what no longer fits is dropped, the rest kept.
		"PackCacheMaxBytes": "pack-cache-max-bytes", "PackCacheMaxAge": "pack-cache-max-age",
		"PackCacheMinUses": "pack-cache-min-uses", "PackCacheMinFreeBytes": "pack-cache-min-free-bytes",
		"FetchCacheMaxBytes": "fetch-cache-max-bytes", "FetchCacheMaxAge": "fetch-cache-max-age",
		"FetchCacheMinFreeBytes": "fetch-cache-min-free-bytes", "FetchCacheSightingWindow": "fetch-cache-sighting-window",
		// Request records: the next trim keeps to them.
		"RecordsMaxAge": "records-max-age", "RecordsMaxCount": "records-max-count",
	}
	stopSettings = map[string]string{
		"DataDir": "data", "Database": "database", "Node": "node",
		"GitAddr": "git", "HTTPAddr": "http", "SSHAddr": "ssh", "MetricsAddr": "metrics",
	}
)

// Changes compares a re-read configuration with the running one: the
// settings (flag names) Reload applies in place, those a next process
// must apply (a hand over), and those only a stop and start can.
func (s *Server) Changes(next Config) (live, handOver, stop []string) {
	cur, nv := reflect.ValueOf(s.Config), reflect.ValueOf(next)
	for i := range cur.NumField() {
		f := cur.Type().Field(i)
		switch f.Name {
		case "Log", "Listeners", "HandedOver":
			continue
		}
		if reflect.DeepEqual(cur.Field(i).Interface(), nv.Field(i).Interface()) {
			continue
		}
		if name, ok := liveSettings[f.Name]; ok {
			live = append(live, name)
		} else if name, ok := stopSettings[f.Name]; ok {
			stop = append(stop, name)
		} else {
			handOver = append(handOver, flagName(f.Name))
		}
	}
	slices.Sort(live)
	slices.Sort(handOver)
	slices.Sort(stop)
	return live, handOver, stop
}

// flagName turns a Config field name into serve's flag spelling as best
// it can (MaxPushBytes: max-push-bytes), for log lines.
func flagName(field string) string {
	var b strings.Builder
	for i, r := range field {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte('-')
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}

// Reload applies next's live settings (see liveSettings) to the running
// server. Limits: requests running keep their slots; waiting ones are
// admitted at once if the new limits allow. Timeouts: connections and
// requests that start from now on take the new ones; those already open
// keep the ones they started with. Cache bounds: a cache keeps what it
// holds, but what no longer fits a lower bound, least recently used first.
// Record retention: the next trim keeps to it.
//
// Not changed in place: net/http's own header-read and kept-alive idle
// deadlines on the HTTP listener (ReadHeaderTimeout, IdleTimeout), which
// it reads without a lock; they keep the start values of --init-timeout
// and --timeout until the next hand over.
func (s *Server) Reload(next Config) {
	p := s.Pipeline
	p.Limiter.SetLimits(next.MaxPackJobs, next.MaxPackJobsPerRepo, p.Limiter.PerClientLimit(), next.MaxQueue, next.MaxQueueWait)
	p.Pushes.SetLimits(next.MaxPushJobs, 0, next.MaxPushesPerUser, next.MaxQueue, next.MaxQueueWait)
	p.SetMaxPerClient(next.MaxRequestsPerClient)
	if p.Spool != nil {
		p.Spool.SetBounds(next.MaxSpooledBytes, next.MaxSpooledBytesPerAddr)
	}

	p.SetTimeouts(pipeline.Timeouts{Idle: next.IdleTimeout, Pace: requestPace(next)})
	if s.daemon != nil {
		s.daemon.SetInitTimeout(next.InitTimeout)
	}
	if s.ssh != nil {
		s.ssh.SetTimeouts(sshtransport.Timeouts{Init: next.InitTimeout, KeepAlive: next.SSHKeepAlive, Idle: next.SSHIdleTimeout})
	}
	s.Maintainer.SetQuarantineAge(maintain.QuarantineAge(next.IdleTimeout))
	if s.Outbox != nil {
		s.Outbox.SetTimeouts(map[string]time.Duration{store.KindWebhook: next.HookTimeout, store.KindPushMirror: next.MirrorPushTimeout})
	}

	if p.PackCache != nil {
		p.PackCache.SetBounds(packcache.Bounds{MaxBytes: next.PackCacheMaxBytes, MaxAge: next.PackCacheMaxAge,
			MinUses: next.PackCacheMinUses, MinFreeBytes: next.PackCacheMinFreeBytes})
	}
	if p.FetchCache != nil {
		p.FetchCache.SetBounds(fetchcache.Bounds{MaxBytes: next.FetchCacheMaxBytes, MaxAge: next.FetchCacheMaxAge,
			MinFreeBytes: next.FetchCacheMinFreeBytes, SightingWindow: next.FetchCacheSightingWindow})
	}

	s.Governor.SetRetention(next.RecordsMaxAge, next.RecordsMaxCount)

	for field := range liveSettings {
		reflect.ValueOf(&s.Config).Elem().FieldByName(field).Set(reflect.ValueOf(next).FieldByName(field))
	}
}

// requestPace is how slowly a request may arrive under cfg.
func requestPace(cfg Config) pipeline.Pace {
	return pipeline.Pace{Grace: cfg.InitTimeout, MinRate: cfg.RequestMinRate, Max: cfg.RequestTimeout}
}
