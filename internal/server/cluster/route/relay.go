package route

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"packwire/internal/access"
	"packwire/internal/gitexec"
	"packwire/internal/pipeline"
	"packwire/internal/server/cluster"
)

// RelayPath is the endpoint on every node's HTTP listener that serves a
// request another node passed on. Only the cluster user may call it.
const RelayPath = "/_packwire/relay"

// The request, as headers of the relay call.
const (
	hdrTransport = "X-Packwire-Transport"
	hdrService   = "X-Packwire-Service"
	hdrRepo      = "X-Packwire-Repo"
	hdrProtocol  = "X-Packwire-Protocol"
	hdrUser      = "X-Packwire-User"
	hdrVia       = "X-Packwire-Via"
	hdrRemote    = "X-Packwire-Remote"
	hdrStateless = "X-Packwire-Stateless"
	hdrAdvertise = "X-Packwire-Advertise"
	// Trailers: git's exit code and what it wrote to stderr.
	trlExit   = "X-Packwire-Exit"
	trlStderr = "X-Packwire-Stderr"
	// hdrAccessVersion: the store version the relaying node checked the
	// client's token at (access.Principal.CheckedVersion).
	hdrAccessVersion = "X-Packwire-Access-Version"
	// hdrPlacement: the repository's placement as the relaying node read
	// it (base64 of its JSON), which the serving node routes by instead
	// of reading it again.
	hdrPlacement = "X-Packwire-Placement"
)

// carriedKey is the context key of a relayed request's placement.
type carriedKey struct{}

// withPlacement carries a relayed request's placement to Route.
func withPlacement(ctx context.Context, pl cluster.Placement) context.Context {
	return context.WithValue(ctx, carriedKey{}, pl)
}

// carried is the placement of repo the relaying node sent with this
// request, if any.
func carried(ctx context.Context, repo string) (cluster.Placement, bool) {
	pl, ok := ctx.Value(carriedKey{}).(cluster.Placement)
	return pl, ok && pl.Repo == repo
}

// encodePlacement and decodePlacement are hdrPlacement's value.
func encodePlacement(pl cluster.Placement) string {
	b, _ := json.Marshal(pl)
	return base64.StdEncoding.EncodeToString(b)
}

func decodePlacement(v string) (cluster.Placement, bool) {
	var pl cluster.Placement
	b, err := base64.StdEncoding.DecodeString(v)
	if err != nil || v == "" || json.Unmarshal(b, &pl) != nil || pl.Repo == "" {
		return cluster.Placement{}, false
	}
	return pl, true
}

// relayHeaderWait bounds how long a relay waits for the serving node's
// decision (its Prepare; a stale copy's catch-up waits at most
// CatchUpWait): a node silent for longer is treated as unreachable.
const relayHeaderWait = time.Minute

// relayTransport carries one relay: no overall timeout (a clone streams
// for as long as it takes), a bounded dial, and its connection watched:
// failed is called when reading the serving node's side fails.
func relayTransport(failed func(error), seen *atomic.Int64) *http.Transport {
	d := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &watchedConn{Conn: c, failed: failed, seen: seen}, nil
		},
		DisableCompression: true,
		DisableKeepAlives:  true, // the serving node closes each relay's connection
	}
}

// watchedConn reports its first read error, and when it last read
// something (seen, Unix nanoseconds).
type watchedConn struct {
	net.Conn
	failed func(error)
	seen   *atomic.Int64
}

func (c *watchedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.seen.Store(time.Now().UnixNano())
	}
	if err != nil {
		c.failed(err)
	}
	return n, err
}

// refusal is a relayed request's refusal, as the serving node decided it.
type refusal struct {
	Code       pipeline.Code `json:"code"`
	Message    string        `json:"message"`
	RetryAfter time.Duration `json:"retry_after"`
}

// relayTo opens the relay to node to at once, in Route, and waits for
// that node's decision (its Prepare): a refusal there is this request's
// refusal, in the client's transport's framing, before anything is
// written to the client (an HTTP status, an ERR line). The streams flow
// in Relay. pl, the placement this node routed by, goes with the request
// (see hdrPlacement).
func (rt *Router) relayTo(ctx context.Context, to cluster.Replica, req pipeline.Request, repoName string, pl cluster.Placement) (pipeline.Relayer, error) {
	body, bodyW := io.Pipe()
	// Go's Transport returns from a failed round trip only once it has
	// stopped writing the request's body, and this body is a pipe that
	// Relay feeds later: so every failure before the answer's headers
	// (the node's connection fails, no answer in time, the client left)
	// must close the pipe, or Do waits for ever.
	waitCtx, abort := context.WithCancelCause(context.WithoutCancel(ctx))
	defer abort(nil)
	var answered atomic.Bool
	fail := func(err error) {
		if !answered.Load() {
			abort(err)
		}
	}
	stopClient := context.AfterFunc(ctx, func() { fail(context.Cause(ctx)) })
	defer stopClient()
	headerTimer := time.AfterFunc(relayHeaderWait, func() {
		fail(fmt.Errorf("no answer from node %s within %v", to.Node, relayHeaderWait))
	})
	defer headerTimer.Stop()
	stopBody := context.AfterFunc(waitCtx, func() { body.CloseWithError(context.Cause(waitCtx)) })
	defer stopBody()
	// The relay's own context outlives the wait: Relay's streams end
	// with the client's context, which Relay watches itself.
	relayCtx, endRelay := context.WithCancel(context.WithoutCancel(ctx))
	stopRelay := context.AfterFunc(waitCtx, endRelay)
	hreq, err := http.NewRequestWithContext(relayCtx, http.MethodPost, strings.TrimRight(to.URL, "/")+RelayPath, body)
	if err != nil {
		endRelay()
		return nil, err
	}
	h := hreq.Header
	h.Set(hdrTransport, req.Transport)
	h.Set(hdrService, string(req.Service))
	h.Set(hdrRepo, repoName)
	h.Set(hdrProtocol, req.Protocol)
	h.Set(hdrUser, req.Principal.User)
	h.Set(hdrVia, req.Principal.Via)
	h.Set(hdrRemote, req.Remote)
	h.Set(hdrStateless, strconv.FormatBool(req.StatelessRPC))
	h.Set(hdrAdvertise, strconv.FormatBool(req.AdvertiseRefs))
	// The access version this node checked the token at: the serving
	// node decides as of the same moment, without reading it again.
	if v, ok := req.Principal.CheckedVersion(); ok {
		h.Set(hdrAccessVersion, strconv.FormatInt(v, 10))
	}
	if pl.Repo == repoName {
		h.Set(hdrPlacement, encodePlacement(pl))
	}
	hreq.SetBasicAuth(access.ClusterUser, rt.Secret)
	// Watched while it waits and streams: a node the cluster gives up on
	// (paused, cut off, no longer the primary) is given up on here too.
	var seen atomic.Int64
	seen.Store(time.Now().UnixNano())
	watch := &relayWatch{rt: rt, repo: repoName, to: to.Node, write: req.Service == gitexec.ReceivePack,
		quiet: func() time.Duration { return time.Since(time.Unix(0, seen.Load())) }}
	// The watch ends with the relay, or with the client's request (a
	// call abandoned before Relay ran never ends the relay's context).
	watchCtx, endWatch := context.WithCancel(relayCtx)
	stopWatch := context.AfterFunc(ctx, endWatch)
	go func() {
		defer stopWatch()
		defer endWatch()
		watch.watch(watchCtx, func() {
			fail(watch.lost())
			endRelay()
		})
	}()
	resp, err := (&http.Client{Transport: relayTransport(fail, &seen)}).Do(hreq)
	answered.Store(true)
	if !stopRelay() {
		// The wait was given up on as the answer came: the relay is over.
		if err == nil {
			resp.Body.Close()
			err = context.Cause(waitCtx)
		}
	}
	if err != nil {
		endRelay()
		bodyW.Close()
		if lost := watch.lost(); lost != nil {
			// Nothing of the client's request went to that node: Route
			// routes it again (errServingLost).
			return nil, &pipeline.Error{Code: pipeline.CodeUnavailable, RetryAfter: time.Second,
				Message: fmt.Sprintf("service temporarily unavailable: node %s, which serves '%s', stopped answering or is no longer its primary; retry shortly", to.Node, repoName), Err: lost}
		}
		return nil, &pipeline.Error{Code: pipeline.CodeUnavailable, RetryAfter: 2 * time.Second,
			Message: fmt.Sprintf("node %s, which serves '%s', is unreachable; retry shortly", to.Node, repoName), Err: err}
	}
	if resp.StatusCode != http.StatusOK {
		defer endRelay()
		defer resp.Body.Close()
		bodyW.Close()
		var ref refusal
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64*1024))
		if json.Unmarshal(b, &ref) != nil || ref.Code == 0 {
			return nil, &pipeline.Error{Code: pipeline.CodeInternal, Message: fmt.Sprintf("internal error relaying to node %s (HTTP %d)", to.Node, resp.StatusCode),
				Err: fmt.Errorf("relay: HTTP %d: %s", resp.StatusCode, b)}
		}
		return nil, &pipeline.Error{Code: ref.Code, Message: ref.Message, RetryAfter: ref.RetryAfter}
	}
	return &openRelay{node: to.Node, resp: resp, body: bodyW, end: endRelay, watch: watch}, nil
}

// openRelay is a relay the serving node accepted: its answer's body, and
// the pipe its request's body reads from.
type openRelay struct {
	node string
	resp *http.Response
	body *io.PipeWriter
	end  context.CancelFunc // the relay call's context
	// watch cuts the relay (end) when the cluster gives up on its node.
	watch *relayWatch
}

// Relay streams stdin to the serving node and its answer to stdout, both
// ways at once (a git:// or SSH session negotiates).
func (r *openRelay) Relay(ctx context.Context, req pipeline.Request, repoName string, stdin io.Reader, stdout, stderr io.Writer) (gitexec.Result, error) {
	defer r.end()
	defer r.resp.Body.Close()
	var sent atomic.Int64
	go func() {
		n, err := io.Copy(r.body, stdin)
		sent.Store(n)
		r.body.CloseWithError(err)
	}()
	stopBody := context.AfterFunc(ctx, func() { r.body.CloseWithError(ctx.Err()) })
	defer stopBody()
	n, err := io.Copy(stdout, r.resp.Body)
	res := gitexec.Result{BytesOut: n, BytesIn: sent.Load()}
	if err != nil {
		if ctx.Err() != nil || isWriteErr(err) {
			return res, gitexec.ErrClientGone
		}
		if lost := r.watch.lost(); lost != nil {
			// Cut here: a push may or may not have been committed by that
			// node (never acknowledged to the client); it fails, and the
			// client's retry goes to the node serving now.
			return res, &pipeline.Error{Code: pipeline.CodeUnavailable, RetryAfter: time.Second,
				Message: fmt.Sprintf("service temporarily unavailable: node %s, which served '%s', stopped answering or is no longer its primary during the request; retry shortly", r.node, repoName),
				Err:     fmt.Errorf("relay from node %s: %w", r.node, lost)}
		}
		// The serving node failed mid-request (killed, cut off): the
		// client is told so and may retry, not that its request was bad.
		return res, &pipeline.Error{Code: pipeline.CodeUnavailable, RetryAfter: 2 * time.Second,
			Message: fmt.Sprintf("node %s, which served '%s', failed during the request; retry shortly", r.node, repoName),
			Err:     fmt.Errorf("relay from node %s: %w", r.node, err)}
	}
	res.ExitCode, _ = strconv.Atoi(r.resp.Trailer.Get(trlExit))
	if msg, _ := base64.StdEncoding.DecodeString(r.resp.Trailer.Get(trlStderr)); len(msg) > 0 {
		res.Stderr = string(msg)
		if stderr != nil {
			stderr.Write(msg)
		}
	}
	return res, nil
}

// isWriteErr: io.Copy failed writing to the client, not reading the node.
func isWriteErr(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "write" || errors.Is(err, io.ErrClosedPipe)
}

// Handler serves RelayPath: the request another node passed on, run
// through this node's pipeline as if its client had come here (access
// decided again for the same user), streaming both ways.
func Handler(p *pipeline.Pipeline, acc *access.Controller) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !fromCluster(acc, w, r) {
			return
		}
		if r.Method != http.MethodPost {
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		service, ok := gitexec.ParseService(r.Header.Get(hdrService))
		if !ok {
			http.Error(w, "bad service", http.StatusBadRequest)
			return
		}
		req := pipeline.Request{
			Transport:     r.Header.Get(hdrTransport),
			Service:       service,
			RepoPath:      r.Header.Get(hdrRepo),
			Protocol:      r.Header.Get(hdrProtocol),
			Principal:     access.Principal{User: r.Header.Get(hdrUser), Via: r.Header.Get(hdrVia)},
			Remote:        r.Header.Get(hdrRemote),
			StatelessRPC:  r.Header.Get(hdrStateless) == "true",
			AdvertiseRefs: r.Header.Get(hdrAdvertise) == "true",
			Relayed:       true,
		}
		if req.Principal.User == "" {
			req.Principal = access.Anonymous
		} else if v, err := strconv.ParseInt(r.Header.Get(hdrAccessVersion), 10, 64); err == nil {
			req.Principal = access.WithCheckedVersion(req.Principal, v)
		}
		if req.Principal.IsCluster() {
			http.Error(w, "a relay carries a client's request", http.StatusBadRequest)
			return
		}
		ctx := r.Context()
		if pl, ok := decodePlacement(r.Header.Get(hdrPlacement)); ok {
			ctx = withPlacement(ctx, pl)
		}
		call, err := p.Prepare(ctx, req)
		if err != nil {
			var perr *pipeline.Error
			if !errors.As(err, &perr) {
				perr = &pipeline.Error{Code: pipeline.CodeInternal, Message: "internal error"}
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusConflict)
			json.NewEncoder(w).Encode(refusal{Code: perr.Code, Message: perr.Message, RetryAfter: perr.RetryAfter})
			return
		}
		rc := http.NewResponseController(w)
		rc.EnableFullDuplex() // read the client's stream while answering (sessions negotiate)
		// The connection ends with the relay: git's side may still be
		// reading the stream when the answer is done, and the server must
		// not read a next request meanwhile.
		w.Header().Set("Connection", "close")
		w.Header().Set("Trailer", trlExit+", "+trlStderr)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusOK)
		rc.Flush()
		var stderr strings.Builder
		res, _ := call.Run(ctx, r.Body, flushWriter{w, rc}, &limitedWriter{w: &stderr, n: 64 * 1024})
		w.Header().Set(trlExit, strconv.Itoa(res.ExitCode))
		w.Header().Set(trlStderr, base64.StdEncoding.EncodeToString([]byte(stderr.String())))
	})
}

// flushWriter sends each write at once: the other node's client waits
// for git's answer as it comes.
type flushWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (f flushWriter) Write(b []byte) (int, error) {
	n, err := f.w.Write(b)
	if err == nil {
		err = f.rc.Flush()
	}
	return n, err
}

type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(b []byte) (int, error) {
	if l.n > 0 {
		k := min(len(b), l.n)
		l.w.Write(b[:k])
		l.n -= k
	}
	return len(b), nil
}
