// Package pipeline is the one path every git request takes, whatever its
// transport: resolve the repository, decide access, spawn and relay git,
// log what it cost. Transports build a Request from their framing, call
// Prepare, render a refusal in their own framing, or stream through Run.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"packwire/internal/access"
	"packwire/internal/fetchcache"
	"packwire/internal/gitexec"
	"packwire/internal/governor"
	"packwire/internal/hookmode"
	"packwire/internal/limiter"
	"packwire/internal/packcache"
	"packwire/internal/protocol"
	"packwire/internal/push"
	"packwire/internal/reach"
	"packwire/internal/repo"
	"packwire/internal/repostate"
)

// Request is a transport-neutral git request.
type Request struct {
	Transport     string // "git", "http" or "ssh"
	Service       gitexec.Service
	RepoPath      string // as the client sent it
	Protocol      string // GIT_PROTOCOL value ("version=2"), empty for v0
	Principal     access.Principal
	Remote        string // client address
	StatelessRPC  bool   // smart HTTP
	AdvertiseRefs bool   // smart HTTP info/refs
	// BaseURL is the scheme and host the client reached (HTTP), for the
	// bundle URI when Pipeline.PublicURL is not set; empty elsewhere.
	BaseURL string
	// Relayed: another node of a cluster passed this request on; it is
	// served here or refused, never relayed again.
	Relayed bool
}

// Code classifies a refusal so that each transport can render it in its
// framing (an HTTP status, an ERR pkt-line, an SSH exit status).
type Code int

const (
	CodeBadRequest Code = iota + 1
	CodeNotFound
	CodeAuthRequired
	CodeForbidden
	CodeUnavailable
	CodeInternal
	CodeTimeout // the client was too slow sending its request
)

// Error is a refusal with a one-line message in git's words.
type Error struct {
	Code       Code
	Message    string
	Err        error         // the underlying cause, for logs
	RetryAfter time.Duration // CodeUnavailable: when to try again
}

func (e *Error) Error() string { return e.Message }
func (e *Error) Unwrap() error { return e.Err }

// StoreUnavailable is the refusal of a request whose store (the access
// model, a cluster's placement) could not answer in time: a PostgreSQL
// restarting, or cut off. The client may retry; nothing was done.
func StoreUnavailable(cause error) *Error {
	return &Error{Code: CodeUnavailable, RetryAfter: 5 * time.Second, Err: cause,
		Message: "service temporarily unavailable: the server cannot reach its database, retry later"}
}

// ErrShuttingDown is the cause of refusals while the server drains.
var ErrShuttingDown = errors.New("server shutting down")

// Pipeline holds what every request needs.
type Pipeline struct {
	Repos    repo.Root
	Access   *access.Controller
	Runner   *gitexec.Runner
	Governor *governor.Governor // nil: requests are logged, not recorded
	Log      *slog.Logger

	// PackCache shares pack-objects runs between identical fetches; nil: off.
	// HookExecutable is the binary upload-pack runs as its pack-objects hook
	// (packwire itself), HookSocket where that hook finds the cache.
	PackCache      *packcache.Cache
	HookExecutable string
	HookSocket     string

	// Limiter admits requests that may generate packs (fetches, archives);
	// nil: no limit.
	Limiter *limiter.Limiter
	// Pushes admits pushes that will write (receive-pack runs), once
	// their commands are read, with its PerClient bound per user; nil: no
	// limit.
	Pushes *limiter.Limiter
	// MaxPushRefs bounds the ref updates of one push (0: DefaultMaxPushRefs).
	MaxPushRefs int
	// MaxPushBytes bounds the pack of one push (git's receive.maxInputSize;
	// 0: none); a repository's quota may bound it further.
	MaxPushBytes int64
	// FsckPushes has git check every pushed object (receive.fsckObjects).
	FsckPushes bool
	// LFS, when set, checks every push that writes: receive-pack runs
	// its pre-receive hook (HooksDir) with the environment PushEnv
	// gives, which refuses new LFS pointers to objects the server does
	// not hold for the repository (internal/lfs).
	LFS interface {
		PushEnv(repoName string) []string
	}
	// LFSBytes, when set, is what a repository's LFS objects take: the
	// quota counts them with git's objects.
	LFSBytes func(ctx context.Context, repoName string) (int64, error)
	// RequestPace bounds how slowly a client may send its request (an HTTP
	// fetch body, a git:// or SSH pack request) before it takes a slot.
	RequestPace Pace
	// MaxPerClient bounds the requests one client runs at once: a user, or
	// an anonymous client by its address (0: no bound).
	MaxPerClient int
	// Reach refuses wants of objects no visible ref reaches; nil: git's
	// own rules (protocol v2 serves any object by id).
	Reach *reach.Checker
	// ObjectInfo serves protocol v2's object-info command (the size of
	// any object by id, reachable or not); off: neither advertised nor
	// answered, as git does with transfer.advertiseObjectInfo off.
	ObjectInfo bool
	// BundleURIs advertises protocol v2's bundle-uri command and answers
	// it with the URL of the repository's clone bundle, where it has one
	// (maintain.BundleFile, served by the HTTP transport at BundleSuffix).
	BundleURIs bool
	// PublicURL is the HTTP base URL clients reach this server at
	// ("https://git.example.com"), for bundle URIs over every transport;
	// empty: HTTP's own request address, and ListenerURL over git:// and SSH.
	PublicURL string
	// ListenerURL is the HTTP listener's own address ("": no HTTP listener:
	// no bundle URIs over git:// and SSH unless PublicURL is set).
	ListenerURL string
	// TempDir holds request bodies too large to keep in memory ("": the
	// system's), within Spool's bounds (nil: none).
	TempDir string
	Spool   *Spool

	// HooksDir is receive-pack's hooks directory (core.hooksPath), with
	// packwire's proc-receive hook that checks fast-forward-only updates
	// (internal/pushguard); the files listing those refs go there too.
	HooksDir string

	// FetchCache stores and replays whole responses to stateless v2
	// fetches without haves (see fetch.go); nil: off.
	FetchCache *fetchcache.Cache

	// PushRefusal, if set, says why a repository takes no push at all (a
	// read-only mirror), for writers who got past access ("": it takes them).
	PushRefusal func(repo.Repo) string
	// OnPush, if set, hears of every push that wrote refs once the client
	// has its report (events.go), in the request's goroutine: it must be
	// quick (webhooks and push mirrors queue one row).
	OnPush func(context.Context, PushEvent)

	// Cluster, if set, says whether this node serves a repository when
	// nodes share one store (internal/server/cluster): asked once access
	// is decided, so that transports never learn about nodes.
	Cluster Router

	answers answerCache // advertisements and ls-refs answers by repository state

	timeouts atomic.Pointer[Timeouts] // set by SetTimeouts; nil: Runner.IdleTimeout and RequestPace

	gitStarts atomic.Int64 // git processes requests started (startGit)
	// spawn, if set, runs git in startGit's stead (tests: a git in process).
	spawn func(ctx context.Context, spec gitexec.Spec, stdin io.Reader, stdout, stderr io.Writer) (gitexec.Result, error)

	mu       sync.Mutex
	draining bool
	running  map[uint64]*runningCall // by Call.ID, under mu: what Active shows
	clients  map[string]int          // requests prepared and not ended, per client, under mu
	active   sync.WaitGroup
	inFlight atomic.Int64
	kill     context.CancelFunc // kills every running request (after the grace period)
	killCtx  context.Context
	ids      atomic.Uint64
}

// Call is a prepared, authorized request, ready to run.
// Router decides whether this node serves a request for a repository of
// a cluster, and what a push served here needs.
type Router interface {
	// Route returns how to serve, or a refusal (an *Error). r is the
	// repository as this node resolved it: Path "" when its copy is not
	// on this node's disk.
	Route(ctx context.Context, r repo.Repo, write bool, req Request) (Route, error)
}

// Route is how this node serves a request: for a push, what receive-pack
// needs besides the pipeline's own settings (the cluster's
// reference-transaction hook, which replicates before git commits); or
// another node that serves it (Relay).
type Route struct {
	Env    []string
	Config []string
	// Relay, if set, passes the request's streams to the node that serves
	// it: no git runs here and no slot is taken (that node admits it).
	Relay Relayer
	// HeadMoved, if set, is told when a push moved HEAD to the first
	// branch pushed (repo.FollowFirstPush): HEAD is not a ref, so the
	// cluster carries it to the other copies itself.
	HeadMoved func(ctx context.Context, branch string) error
	// Push, if set, is asked what one push's receive-pack needs besides
	// Env and Config (kept: the commands it is given; guarded: some go
	// through the proc-receive hook); done is called once it has exited.
	Push func(kept []push.Command, guarded bool) (env, config []string, done func())
}

// Relayer serves a request on another node, streaming both ways.
type Relayer interface {
	Relay(ctx context.Context, req Request, repoName string, stdin io.Reader, stdout, stderr io.Writer) (gitexec.Result, error)
}

type Call struct {
	p         *Pipeline
	route     Route
	Request   Request
	Repo      repo.Repo
	ID        uint64
	RecordID  string // the governor record's id, known up front for the pack hook
	started   time.Time
	releaseWG func()
	gated     bool     // admitted at the first pack request of the session (admissionGate), not at Prepare
	timeouts  Timeouts // taken at Prepare: a reload does not change a running request's

	// The limiter slot, set by the request's goroutine or by the client
	// stream's (the admission gate), read at the end and by Active.
	admitMu   sync.Mutex
	queueWait time.Duration
	release   func()        // the limiter slot, if one was taken
	ended     bool          // released: a late admission gives its slot back at once
	model     *access.Model // the access model read at Prepare, for push rules
	outcome   string        // how the fetch cache served the request, if it did
	side      sideRuns      // a session's fetch cache answers (sessionFetch)

	running *runningCall // set by Run, for views of running requests
	// input is the client's stream, counting its reads; gitStarts the
	// gits started for the request (startGit: never more than 1 + reads).
	input     *clientInput
	gitStarts atomic.Int64
	// CPU (ns) of the checks of wanted objects: git run outside the relay.
	checkUser, checkSys atomic.Int64
	pushOutcome         pushOutcome // what a push's report says, when it says more than git's exit
	pushBusy            bool        // the push found no slot
}

func (p *Pipeline) log() *slog.Logger {
	if p.Log == nil {
		return slog.Default()
	}
	return p.Log
}

// Prepare resolves the repository and decides access. The error, if any, is
// an *Error to show the client. A successful Call must be Run or Abandoned.
func (p *Pipeline) Prepare(ctx context.Context, req Request) (*Call, error) {
	p.mu.Lock()
	if p.draining {
		p.mu.Unlock()
		return nil, &Error{Code: CodeUnavailable, Message: "server is shutting down, retry shortly", Err: ErrShuttingDown}
	}
	p.initKillLocked()
	client := clientKey(req)
	if p.clients == nil {
		p.clients = map[string]int{}
	}
	p.clients[client]++
	maxPerClient := p.MaxPerClient
	busy := maxPerClient > 0 && p.clients[client] > maxPerClient
	p.active.Add(1)
	p.mu.Unlock()
	req.Protocol = CleanProtocol(req.Protocol)
	now := time.Now()
	call := &Call{p: p, Request: req, ID: p.ids.Add(1), RecordID: governor.NewID(now), started: now, timeouts: p.Timeouts()}
	var once sync.Once
	call.releaseWG = func() {
		once.Do(func() {
			call.admitMu.Lock()
			release := call.release
			call.release, call.ended = nil, true
			call.admitMu.Unlock()
			if release != nil {
				release()
			}
			p.mu.Lock()
			if p.clients[client]--; p.clients[client] <= 0 {
				delete(p.clients, client)
			}
			p.mu.Unlock()
			p.active.Done()
		})
	}

	var err error
	if busy {
		// Refused before anything is read or spawned for it: one client (a
		// flood of SSH channels, HTTP requests) cannot hold every process.
		err = &Error{Code: CodeUnavailable, RetryAfter: 5 * time.Second,
			Message: fmt.Sprintf("server busy: too many concurrent requests from %s (max %d), retry later", client, maxPerClient)}
	} else {
		err = p.authorize(ctx, call)
	}
	if err != nil {
		call.releaseWG()
		// Under the repository only when it resolved (call.Repo): a path that
		// names none goes into the error, so that what clients type never
		// becomes a repository of the records.
		rec := call.record()
		rec.Kind = string(protocol.NewClassifier(req.Service, false).Summary(req.AdvertiseRefs, req.StatelessRPC).Kind)
		rec.Result = governor.ResultRefused
		rec.Error = err.Error()
		if call.Repo.Name == "" {
			rec.Error += " (path " + strconv.Quote(printable(req.RepoPath)) + ")"
		}
		var perr *Error
		if errors.As(err, &perr) && perr.Code == CodeAuthRequired && req.Principal.IsAnonymous() {
			rec.Result = governor.ResultChallenged
		}
		rec.Wall = governor.Duration(time.Since(call.started))
		rec.QueueWait = governor.Duration(call.waited())
		p.finish(&rec, slog.String("cause", fmt.Sprint(errors.Unwrap(err))))
		return nil, err
	}
	return call, nil
}

// record starts the request's governor record with what is known up front.
func (c *Call) record() governor.Record {
	req := c.Request
	return governor.Record{
		ID:        c.RecordID,
		Start:     c.started,
		Transport: req.Transport,
		Protocol:  protocol.Version(req.Protocol),
		Repo:      c.Repo.Name,
		User:      req.Principal.User,
		Remote:    req.Remote,
		Service:   string(req.Service),
	}
}

// finish logs the request's one line and hands the record to the governor.
func (p *Pipeline) finish(rec *governor.Record, extra ...slog.Attr) {
	level := slog.LevelInfo
	if rec.Result != governor.ResultOK && rec.Result != governor.ResultRefused {
		level = slog.LevelWarn
	}
	p.log().LogAttrs(context.Background(), level, "request", append(rec.LogAttrs(), extra...)...)
	if p.Governor != nil {
		p.Governor.Record(*rec)
	}
}

func (p *Pipeline) authorize(ctx context.Context, call *Call) error {
	req := call.Request
	if req.Service == "" {
		return &Error{Code: CodeBadRequest, Message: "unsupported service"}
	}
	model, err := p.Access.Load(ctx, req.Principal)
	if err != nil {
		return StoreUnavailable(err)
	}
	call.model = model
	op := access.Read
	if req.Service == gitexec.ReceivePack {
		op = access.Write
	}
	notFound := func(name, shown string, cause error) error {
		// Anonymous over HTTP: 401 so that git asks for credentials. Given
		// for a missing repository too whenever anonymous could not read a
		// repository of that name, so the status leaks nothing either.
		if req.Transport == "http" && req.Principal.IsAnonymous() && (op == access.Write || !model.AnonRead(name)) {
			return &Error{Code: CodeAuthRequired, Message: fmt.Sprintf("authentication required for '%s'", shown), Err: cause}
		}
		return &Error{Code: CodeNotFound, Message: fmt.Sprintf("repository '%s' not found", shown), Err: cause}
	}
	r, err := p.Repos.Resolve(req.RepoPath)
	if errors.Is(err, repo.ErrNotFound) && p.Cluster != nil {
		// Not on this node: the cluster may hold it elsewhere (Route relays,
		// or says not found).
		if clean, cerr := repo.CleanName(req.RepoPath); cerr == nil {
			r, err = repo.Repo{Name: clean}, nil
		}
	}
	if err != nil {
		if errors.Is(err, repo.ErrNotFound) || errors.Is(err, repo.ErrInvalidName) {
			shown := printable(strings.Trim(req.RepoPath, "/"))
			name := shown
			if clean, cerr := repo.CleanName(req.RepoPath); cerr == nil {
				name = clean
			}
			return notFound(name, shown, err)
		}
		return &Error{Code: CodeInternal, Message: "internal error resolving repository", Err: err}
	}
	call.Repo = r
	switch err := model.Decide(req.Principal, op, r.Name); {
	case err == nil:
		if op == access.Write && r.Path != "" {
			if refusal := p.readOnlyRefusal(r); refusal != "" {
				return &Error{Code: CodeForbidden, Message: refusal}
			}
		}
		if p.Cluster != nil {
			route, err := p.Cluster.Route(ctx, r, op == access.Write, req)
			if err != nil {
				var perr *Error
				if errors.As(err, &perr) {
					return perr
				}
				return &Error{Code: CodeUnavailable, Message: "cluster: " + err.Error(), Err: err}
			}
			call.route = route
			if route.Relay != nil {
				return nil // admitted where it is served
			}
		}
		if r.Path == "" { // not here when resolved: the router may have made this node's copy since
			if made, err := p.Repos.Resolve(req.RepoPath); err == nil {
				r, call.Repo = made, made
			} else {
				return notFound(r.Name, printable(strings.Trim(req.RepoPath, "/")), repo.ErrNotFound)
			}
		}
		return p.admit(ctx, call)
	case errors.Is(err, access.ErrNoRead):
		// Shown as the client wrote it, exactly like a missing repository.
		return notFound(r.Name, printable(strings.Trim(req.RepoPath, "/")), err)
	case errors.Is(err, access.ErrAuthRequired):
		return &Error{Code: CodeAuthRequired, Message: fmt.Sprintf("push to '%s' requires authentication", r.Name), Err: err}
	case errors.Is(err, access.ErrDenied):
		return &Error{Code: CodeForbidden, Message: fmt.Sprintf("permission denied: %s may not %s '%s'", req.Principal, op, r.Name), Err: err}
	default:
		return &Error{Code: CodeInternal, Message: "internal error checking access", Err: err}
	}
}

// admit takes a limiter slot for requests that may generate a pack.
func (p *Pipeline) admit(ctx context.Context, call *Call) error {
	req := call.Request
	generatesPack := req.Service == gitexec.UploadPack && !req.AdvertiseRefs || req.Service == gitexec.UploadArchive
	if !generatesPack {
		return nil
	}
	if req.Service == gitexec.UploadPack && !req.StatelessRPC && p.FetchCache != nil {
		// The admission gate also answers the session's fetches from the
		// fetch cache, limiter or not.
		call.gated = true
		return nil
	}
	if p.Limiter == nil {
		return nil
	}
	if req.StatelessRPC {
		// Decided in Run, once the body has been read whole (a client that
		// trickles it holds no slot) and says whether git will run at all:
		// a fetch cache replay takes no slot.
		return nil
	}
	if req.Service == gitexec.UploadPack && !req.StatelessRPC {
		// A git:// or SSH session: decided in Run at its first want or
		// command=fetch, so that ls-remote never queues (admissionGate).
		call.gated = true
		return nil
	}
	return call.admitNow(ctx, p.Limiter)
}

// Run spawns git for the call and relays until it exits. It returns git's
// exit code; err is set when the relay failed (client gone, idle, shutdown).
func (c *Call) Run(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer) (gitexec.Result, error) {
	defer c.releaseWG()
	p := c.p
	p.inFlight.Add(1)
	defer p.inFlight.Add(-1)
	rc := p.startRunning(c)
	defer p.stopRunning(c)
	// The request dies with the client's context or with the server's kill switch.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(p.killCtx, func() { cancel(nil) })
	defer stop()

	req := c.Request
	spec := gitexec.Spec{
		Service:       req.Service,
		RepoPath:      c.Repo.Path,
		Protocol:      req.Protocol,
		StatelessRPC:  req.StatelessRPC,
		AdvertiseRefs: req.AdvertiseRefs,
		Env: []string{
			"PACKWIRE_USER=" + req.Principal.User,
			"PACKWIRE_REPO=" + c.Repo.Name,
			"PACKWIRE_TRANSPORT=" + req.Transport,
			"PACKWIRE_REMOTE=" + req.Remote,
		},
	}
	plain := spec // without the pack-objects hook, for answers that generate no pack
	plain.Env = slices.Clone(spec.Env)
	if req.Service == gitexec.UploadPack && p.PackCache != nil && !req.AdvertiseRefs {
		spec.Config = append(spec.Config, packcache.HookConfig(p.HookExecutable))
		spec.Env = append(spec.Env,
			hookmode.Env+"="+hookmode.PackObjects,
			packcache.EnvSocket+"="+p.HookSocket,
			packcache.EnvRequestID+"="+c.RecordID,
			packcache.EnvRepoPath+"="+c.Repo.Path)
	}
	spec.Progress = &rc.progress
	if req.Service == gitexec.UploadPack && protocol.Version(req.Protocol) == 2 && (!req.StatelessRPC || req.AdvertiseRefs) {
		// The answer starts with git's capability advertisement.
		var add []byte
		if c.bundleURI() != "" {
			add = bundleCapability
		}
		if !p.ObjectInfo || add != nil {
			stdout = &capabilityFilter{w: stdout, dropObjectInfo: !p.ObjectInfo, add: add}
		}
	}
	// Without a governor nothing reads the classification: skip the taps,
	// unless the admission gate needs the classifier.
	v2 := protocol.Version(req.Protocol) == 2
	classifier := protocol.NewClassifier(req.Service, v2)
	var watch io.Writer // feeds the classifier what the client sends
	if p.Governor != nil {
		watch = &settleWatch{classifier: classifier, call: rc, stateless: req.StatelessRPC}
		if v2 && req.StatelessRPC && req.Service == gitexec.UploadPack {
			// Only a stateless v2 fetch needs git's answer to tell its kind.
			spec.OutputTap = classifier.Response()
		}
	}
	var gate *admissionGate
	session := c.servesV2Session()
	recorded := c.recordsV0Session()
	clientIn := stdin // the transport's own, for its read deadline
	c.input = &clientInput{r: stdin}
	stdin = c.input
	var negotiation *negotiationPace
	if c.pacesNegotiation() && (c.timeouts.Pace.MinRate > 0 || c.timeouts.Pace.Max > 0) {
		negotiation = newNegotiationPace(stdin, c.timeouts.Pace, stdout, cancel)
		stdin = negotiation
	}
	if req.Service == gitexec.UploadPack && !req.StatelessRPC && c.route.Relay == nil {
		// A git:// or SSH session: it ends once nothing moved for the idle
		// timeout, whatever it is doing.
		moved := func() int64 { return c.input.Reads() + rc.progress.BytesOut.Load() }
		defer idleWatch(c.timeouts.Idle, moved, cancel)()
	}
	switch {
	case recorded:
		// runV0Session reads the client itself and makes its gates.
		if watch == nil {
			watch = classifier
		}
	case session:
		if watch != nil {
			stdin = io.TeeReader(stdin, watch)
		}
	case c.gated:
		if watch == nil {
			watch = classifier
		}
		gate = newAdmissionGate(c.haveFiltered(ctx, stdin), watch, v2, func() error { return c.admitNow(ctx, p.Limiter) },
			func(lines []string) error { return c.checkWants(ctx, lines) }, stdout, c.timeouts.Pace, cancel)
		gate.refuseCommand = p.refusedCommand
		if p.FetchCache != nil && req.Service == gitexec.UploadPack {
			// Stamped before git starts: a v0 advertisement is git's view
			// of the refs at some moment after this (sessionFetch).
			sessionStamp, serr := repostate.Refs(c.Repo.Path, time.Now())
			if serr != nil {
				sessionStamp = repostate.Stamp{}
			}
			gate.intercept = func(request []byte) (bool, error) {
				return c.sessionFetch(ctx, spec, v2, sessionStamp, request, stdout)
			}
		}
		stdin = gate
		if stderr != nil {
			stderr = quietAfterRefusal{w: stderr, refused: gate.refusedC}
		}
	case watch != nil:
		stdin = io.TeeReader(stdin, watch)
	}
	var res gitexec.Result
	var err error
	switch {
	case c.route.Relay != nil:
		c.outcome = governor.PackCacheRelayed
		res, err = c.route.Relay.Relay(ctx, req, c.Repo.Name, stdin, stdout, stderr)
	case recorded:
		res, gate, err = c.runV0Session(ctx, cancel, spec, stdin, watch, stdout, stderr)
	case session:
		res, err = c.runV2Session(ctx, plain, spec, clientIn, stdin, stdout, stderr)
	case req.Service == gitexec.ReceivePack && !req.AdvertiseRefs:
		res, err = c.runPush(ctx, spec, stdin, stdout, stderr)
	case cachesCapabilities(req):
		res, err = c.runCapabilities(ctx, spec, stdout, stderr)
	case cachesRefAdvertisement(req):
		res, err = c.runRefAdvertisement(ctx, spec, stdout, stderr)
	case req.Service == gitexec.UploadPack && req.StatelessRPC && !req.AdvertiseRefs:
		res, err = c.runStateless(ctx, spec, stdin, stdout, stderr)
	default:
		res, err = c.startGit(ctx, spec, stdin, stdout, stderr)
	}

	if gate != nil {
		// An answer from the fetch cache still under way (git was killed)
		// ends with the request: nothing writes to the client after Run.
		cancel(nil)
		gate.close()
		res = c.side.fold(res)
		if sideErr := gate.SideErr(); sideErr != nil && err == nil {
			err = sideErr
		}
		if refusal := gate.Refusal(); refusal != nil {
			err = refusal
		}
	}
	if negotiation != nil {
		if refusal := negotiation.stop(); refusal != nil {
			err = refusal
		}
	}
	sum := classifier.Summary(req.AdvertiseRefs, req.StatelessRPC)
	rec := c.record()
	rec.Kind = string(sum.Kind)
	rec.Wants, rec.Haves, rec.Depth, rec.Filter, rec.PushedRefs = sum.Wants, sum.Haves, sum.Depth, sum.Filter, sum.PushedRefs
	rec.BytesIn, rec.BytesOut = res.BytesIn, res.BytesOut
	rec.Wall = governor.Duration(time.Since(c.started))
	rec.QueueWait = governor.Duration(c.waited())
	rec.UserCPU, rec.SysCPU = governor.Duration(res.UserCPU), governor.Duration(res.SysCPU)
	rec.UserCPU += governor.Duration(c.checkUser.Load())
	rec.SysCPU += governor.Duration(c.checkSys.Load())
	rec.MaxRSS, rec.ExitCode = res.MaxRSS, res.ExitCode
	if p.PackCache != nil {
		taken := p.PackCache.TakeOutcome(c.RecordID)
		rec.PackCache = string(taken.Outcome)
		rec.UserCPU += governor.Duration(taken.UserCPU)
		rec.SysCPU += governor.Duration(taken.SysCPU)
	}
	if c.outcome != "" {
		rec.PackCache = c.outcome
	}
	rec.Result = governor.ResultOK
	var refusal *Error
	switch {
	case errors.As(err, &refusal):
		rec.Result = governor.ResultRefused // admitted late (fetch cache) and refused then
	case errors.Is(err, fetchcache.ErrGenerationFailed):
		rec.Result = governor.ResultGitError // the shared run failed after this replay had begun
	case errors.Is(err, gitexec.ErrClientGone):
		rec.Result = governor.ResultClientGone
	case errors.Is(err, gitexec.ErrIdle):
		rec.Result = governor.ResultTimeout
	case err != nil && p.killCtx.Err() != nil:
		rec.Result = governor.ResultKilled
	case err != nil:
		// The transport cancelled: its client went away (HTTP) or its connection closed.
		rec.Result = governor.ResultClientGone
	case res.ExitCode != 0:
		rec.Result = governor.ResultGitError
	case c.pushOutcome.result != "":
		rec.Result = c.pushOutcome.result
	}
	switch {
	case err != nil:
		rec.Error = err.Error()
	case res.ExitCode != 0:
		rec.Error = res.Stderr
	case c.pushOutcome.err != "":
		rec.Error = c.pushOutcome.err
	}
	p.finish(&rec)
	return res, err
}

// initKillLocked makes the kill switch on first use (a zero Pipeline works).
func (p *Pipeline) initKillLocked() {
	if p.killCtx == nil {
		p.killCtx, p.kill = context.WithCancel(context.Background())
	}
}

// Active is a request whose git is running, as Pipeline.Active sees it.
type Active struct {
	ID        uint64        `json:"id"`
	RecordID  string        `json:"record_id"` // the governor record it will leave
	Transport string        `json:"transport"`
	Service   string        `json:"service"`
	Repo      string        `json:"repo"`
	User      string        `json:"user"` // empty: anonymous
	Remote    string        `json:"remote"`
	Kind      string        `json:"kind"` // empty until the client's request fixes it
	Started   time.Time     `json:"started"`
	QueueWait time.Duration `json:"queue_wait_ns"`
	BytesIn   int64         `json:"bytes_in"`
	BytesOut  int64         `json:"bytes_out"`
}

// runningCall is a Call in Run: the live counters and the kind once known,
// all read atomically, so that Active never holds up the relay.
type runningCall struct {
	call     *Call
	progress gitexec.Progress
	kind     atomic.Pointer[protocol.Kind]
}

func (p *Pipeline) startRunning(c *Call) *runningCall {
	rc := &runningCall{call: c}
	req := c.Request
	var kind protocol.Kind
	switch {
	case req.AdvertiseRefs:
		kind = protocol.Refs
	case req.Service == gitexec.ReceivePack:
		kind = protocol.Push
	case req.Service == gitexec.UploadArchive:
		kind = protocol.Archive
	}
	if kind != "" {
		rc.kind.Store(&kind)
	}
	p.mu.Lock()
	if p.running == nil {
		p.running = map[uint64]*runningCall{}
	}
	p.running[c.ID] = rc
	p.mu.Unlock()
	c.running = rc
	return rc
}

func (p *Pipeline) stopRunning(c *Call) {
	p.mu.Lock()
	delete(p.running, c.ID)
	p.mu.Unlock()
}

// Active returns the requests whose git is running now, oldest first.
func (p *Pipeline) Active() []Active {
	p.mu.Lock()
	out := make([]Active, 0, len(p.running))
	for _, rc := range p.running {
		c := rc.call
		a := Active{ID: c.ID, RecordID: c.RecordID, Transport: c.Request.Transport, Service: string(c.Request.Service),
			Repo: c.Repo.Name, User: c.Request.Principal.User, Remote: c.Request.Remote, Started: c.started,
			QueueWait: c.waited(), BytesIn: rc.progress.BytesIn.Load(), BytesOut: rc.progress.BytesOut.Load()}
		if k := rc.kind.Load(); k != nil {
			a.Kind = string(*k)
		}
		out = append(out, a)
	}
	p.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// settleWatch feeds the classifier and publishes the request's kind for
// Active as soon as the client's request fixes it.
type settleWatch struct {
	classifier *protocol.Classifier
	call       *runningCall
	stateless  bool
	settled    bool
}

func (w *settleWatch) Write(b []byte) (int, error) {
	w.classifier.Write(b)
	if !w.settled {
		if kind, ok := w.classifier.Settled(w.stateless); ok {
			w.call.kind.Store(&kind)
			w.settled = true
		}
	}
	return len(b), nil
}

// Abandon releases a prepared call that will not run.
func (c *Call) Abandon() { c.releaseWG() }

// InFlight is the number of git processes running now.
func (p *Pipeline) InFlight() int64 { return p.inFlight.Load() }

// SetMaxPerClient changes MaxPerClient while requests run (a
// configuration reload); requests running keep running.
func (p *Pipeline) SetMaxPerClient(n int) {
	p.mu.Lock()
	p.MaxPerClient = n
	p.mu.Unlock()
}

// Shutdown refuses new requests and waits for running ones to finish until
// ctx ends; then it kills what is left and waits for it to exit.
func (p *Pipeline) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	p.draining = true
	p.initKillLocked()
	p.mu.Unlock()
	done := make(chan struct{})
	go func() { p.active.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		p.kill()
		<-done
		return ctx.Err()
	}
}

// clientKey names who a request counts against for MaxPerClient: the user,
// or an anonymous client's address without its port.
func clientKey(req Request) string {
	if !req.Principal.IsAnonymous() {
		return req.Principal.User
	}
	return "anonymous@" + remoteHost(req.Remote)
}

// printable keeps control characters out of messages echoed to clients and logs.
func printable(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c < 0x20 || c == 0x7f {
			b[i] = '?'
		}
	}
	if len(b) > 200 {
		b = append(b[:200], "..."...)
	}
	return string(b)
}

// CleanProtocol keeps a client's GIT_PROTOCOL value only if it is made of
// the characters git's own values use ("version=2", "a=b:c=d"); anything
// else is dropped so that no transport passes control bytes to git.
func CleanProtocol(s string) string {
	if len(s) > 1024 {
		return ""
	}
	for _, c := range s {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("=:._-,", c)
		if !ok {
			return ""
		}
	}
	return s
}
