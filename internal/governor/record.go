// Package governor accounts for every request like GitHub's ghe-governor:
// one record per request (who, what, which kind of clone or fetch, bytes,
// git CPU, wall), stored in its own SQLite file with batched writes and a
// retention bound, summarised for `packwire governor`, and exported as
// Prometheus metrics without repo or user labels.
package governor

import (
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"strconv"
	"time"
)

// Record is one request.
type Record struct {
	ID         string    `json:"id"`
	Start      time.Time `json:"start"`
	Transport  string    `json:"transport"`
	Protocol   int       `json:"protocol"`
	Repo       string    `json:"repo"`
	User       string    `json:"user"` // empty: anonymous
	Remote     string    `json:"remote"`
	Service    string    `json:"service"`
	Kind       string    `json:"kind"`
	Wants      int       `json:"wants"`
	Haves      int       `json:"haves"`
	Depth      int       `json:"depth"`
	Filter     string    `json:"filter,omitempty"`
	PushedRefs int       `json:"pushed_refs"`
	BytesIn    int64     `json:"bytes_in"`
	BytesOut   int64     `json:"bytes_out"`
	QueueWait  Duration  `json:"queue_wait_ms"`
	Wall       Duration  `json:"wall_ms"`
	UserCPU    Duration  `json:"cpu_user_ms"`
	SysCPU     Duration  `json:"cpu_sys_ms"`
	MaxRSS     int64     `json:"max_rss_bytes"`
	ExitCode   int       `json:"exit_code"`
	Result     string    `json:"result"` // ok, git-error, client-gone, timeout, killed, refused
	Error      string    `json:"error,omitempty"`
	PackCache  string    `json:"pack_cache,omitempty"` // generated, joined, hit, direct (pack cache); generated, replayed (fetch cache); relayed (served by another cluster node); empty: neither
	Node       string    `json:"node,omitempty"`       // the cluster node that recorded it; empty: a single server
	Version    string    `json:"version,omitempty"`    // the packwire version that served it (buildinfo); empty: recorded before versions were
}

// PackCacheRelayed is the outcome of a request this node passed on to the
// cluster node that served it. That node records the request too (git ran
// there), so totals count it once, from there: summaries, rollups and the
// request metrics leave relayed records out, except by node.
const PackCacheRelayed = "relayed"

// Results a record can have; also the "result" label of the metrics.
const (
	ResultOK         = "ok"
	ResultGitError   = "git-error"   // git exited non-zero
	ResultClientGone = "client-gone" // the client hung up mid-request
	ResultTimeout    = "timeout"     // idle timeout
	ResultKilled     = "killed"      // shutdown or cancellation
	ResultRefused    = "refused"     // never spawned: not found, no access, busy
	// ResultChallenged is an HTTP 401 to a request without credentials:
	// how git learns that a repository needs them, before it asks again
	// with them. Not an error.
	ResultChallenged = "challenged"
)

// Duration is a time.Duration that reads and writes as milliseconds in JSON.
type Duration time.Duration

func (d Duration) MarshalJSON() ([]byte, error) {
	return strconv.AppendFloat(nil, float64(d)/float64(time.Millisecond), 'f', 3, 64), nil
}

func (d *Duration) UnmarshalJSON(b []byte) error {
	ms, err := strconv.ParseFloat(string(b), 64)
	*d = Duration(ms * float64(time.Millisecond))
	return err
}

// CPU is the git CPU of the record, user plus system.
func (r *Record) CPU() time.Duration { return time.Duration(r.UserCPU + r.SysCPU) }

// NewID returns a request id that sorts by time: "rq_" + 12 hex digits of
// Unix milliseconds + 8 random hex digits.
func NewID(t time.Time) string {
	var b [10]byte
	ms := uint64(t.UnixMilli())
	for i := 5; i >= 0; i-- {
		b[i] = byte(ms)
		ms >>= 8
	}
	rand.Read(b[6:])
	return "rq_" + hex.EncodeToString(b[:])
}

// LogAttrs are the record's fields for the one structured log line per request.
func (r *Record) LogAttrs() []slog.Attr {
	attrs := []slog.Attr{
		slog.String("id", r.ID), slog.String("transport", r.Transport), slog.Int("protocol", r.Protocol),
		slog.String("repo", r.Repo), slog.String("user", userOrAnonymous(r.User)), slog.String("remote", r.Remote),
		slog.String("service", r.Service), slog.String("kind", r.Kind),
		slog.Int("wants", r.Wants), slog.Int("haves", r.Haves), slog.Int("depth", r.Depth),
	}
	if r.Filter != "" {
		attrs = append(attrs, slog.String("filter", r.Filter))
	}
	if r.PushedRefs > 0 {
		attrs = append(attrs, slog.Int("pushed_refs", r.PushedRefs))
	}
	attrs = append(attrs,
		slog.Int64("bytes_in", r.BytesIn), slog.Int64("bytes_out", r.BytesOut),
		slog.Int64("queue_wait_ms", time.Duration(r.QueueWait).Milliseconds()),
		slog.Int64("wall_ms", time.Duration(r.Wall).Milliseconds()),
		slog.Int64("cpu_user_ms", time.Duration(r.UserCPU).Milliseconds()),
		slog.Int64("cpu_sys_ms", time.Duration(r.SysCPU).Milliseconds()),
		slog.Int64("max_rss_kb", r.MaxRSS/1024), slog.Int("exit", r.ExitCode), slog.String("result", r.Result),
	)
	if r.PackCache != "" {
		attrs = append(attrs, slog.String("pack_cache", r.PackCache))
	}
	if r.Error != "" {
		attrs = append(attrs, slog.String("error", r.Error))
	}
	return attrs
}

func userOrAnonymous(u string) string {
	if u == "" {
		return "anonymous"
	}
	return u
}

// Failed reports whether the record counts as an error: any result but ok
// and an authentication challenge.
func (r *Record) Failed() bool { return r.Result != ResultOK && r.Result != ResultChallenged }
