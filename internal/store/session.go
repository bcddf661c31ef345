package store

import (
	"context"
	"net"
	"time"

	"github.com/jackc/pgx/v5"
)

// Every PostgreSQL session packwire opens is bounded, so that neither a
// node that went silent (paused, cut off) nor a statement that waits can
// hold a lock, or a caller, for long: PostgreSQL's own defaults wait for
// ever, and a silent peer is noticed only when TCP gives up (two hours).
// A database URL that sets one of these parameters keeps its own value.
var sessionBounds = map[string]string{
	// A session left in a transaction this long (its client paused or
	// cut off) is ended by PostgreSQL, its locks released.
	"idle_in_transaction_session_timeout": "10s",
	// A statement waiting this long for a lock fails instead.
	"lock_timeout": "10s",
	// A statement running this long is cancelled.
	"statement_timeout": "60s",
}

// Connections: opening one gives up after connectTimeout unless the URL
// sets connect_timeout; an established one whose peer went silent is
// dropped after about tcpKeepAlive's idle + interval x count with nothing
// in flight, or after tcpUserTimeout with data unacknowledged.
const (
	connectTimeout = 5 * time.Second
	tcpUserTimeout = 10 * time.Second
)

var tcpKeepAlive = net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: 2 * time.Second, Count: 3}

// boundSessions sets cfg's session parameters, connect timeout and dialer.
func boundSessions(cfg *pgx.ConnConfig) {
	for k, v := range sessionBounds {
		if _, set := cfg.RuntimeParams[k]; !set {
			cfg.RuntimeParams[k] = v
		}
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = connectTimeout
	}
	d := &net.Dialer{KeepAliveConfig: tcpKeepAlive, Control: setUserTimeout}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		return d.DialContext(ctx, network, addr)
	}
}

// RequestTimeout bounds a client request's call to the store (checking
// its access, its credentials, where its repository lives): a store that
// does not answer in time (restarting, cut off without a word) refuses
// the request, which the client may retry, rather than hold it. Connecting
// counts: a request waiting for a connection of a full pool, or for a new
// one to open, gives up too.
const RequestTimeout = 3 * time.Second

// RequestContext is ctx bounded by RequestTimeout.
func RequestContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, RequestTimeout)
}
