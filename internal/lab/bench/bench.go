// Package bench replays GitHub's clone/fetch study (T1-T10) against any Git
// server with the real git client: clones of four kinds, then fetches into
// prepared clones while a pusher pushes, each scenario in its own phase so
// that what the server spends in a phase belongs to that scenario. It
// records every operation (client wall, reset wall, pack bytes, result)
// and the server's CPU from packwire's governor, a cgroup or a process
// tree, never from a guess. Package report turns the result into tables,
// JSON, CSV and HTML.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"packwire/internal/lab/compare"
)

// Config says what to measure and how. The zero value of each optional
// field is a sensible default, except Protocol and PusherInterval, where
// zero means what it says: protocol v0, no pusher.
type Config struct {
	URL     string // the repository clients clone and fetch
	PushURL string // where the pusher pushes (default URL)
	Branch  string // default: the branch the remote's HEAD names

	Scenarios  []Scenario    // default: all ten
	Users      int           // concurrent virtual users (default 1)
	Duration   time.Duration // per scenario (default 30 s) unless Iterations is set
	Iterations int           // operations per user and scenario; wins over Duration

	// PusherInterval is how often the pusher pushes during fetch phases
	// (0: no pusher; the CLI's default is 2 s).
	PusherInterval time.Duration
	Protocol       int    // git protocol.version: 0, 1 or 2 (the CLI's default is 2)
	Git            string // git binary (default "git")
	WorkDir        string // clones live under here (default: a temp dir); removed at the end

	// Server cost: Governor (packwire), or ServerCPU (cgroup, process tree),
	// or neither (not measured).
	Governor  *Governor
	ServerCPU CPUReader
	// GovernorSettle is how long no new record must arrive before a phase's
	// records count as complete (default 1.2 s).
	GovernorSettle time.Duration

	Target string   // what the target is, for the report (e.g. "packwire, synth jquery 1.0")
	Notes  []string // anything else the report should say about the run

	Progress    io.Writer // live progress; nil: none
	ProgressTTY bool      // Progress is a terminal: one line updated in place
}

// Result is everything a run measured.
type Result struct {
	Meta    Meta     `json:"meta"`
	Phases  []Phase  `json:"phases"`
	Samples []Sample `json:"samples"`
	Pushes  []Push   `json:"pushes"`
	Pusher  Pusher   `json:"pusher"`
}

// Meta describes the run.
type Meta struct {
	URL            string    `json:"url"`
	PushURL        string    `json:"push_url,omitempty"`
	Target         string    `json:"target,omitempty"`
	Branch         string    `json:"branch"`
	GitVersion     string    `json:"git_version"`
	Protocol       int       `json:"protocol"`
	Users          int       `json:"users"`
	Duration       string    `json:"duration,omitempty"` // per scenario
	Iterations     int       `json:"iterations,omitempty"`
	PusherInterval string    `json:"pusher_interval"`
	Scenarios      []string  `json:"scenarios"`
	ServerCost     string    `json:"server_cost"`
	BytesMeasure   string    `json:"bytes_measure"`
	Machine        Machine   `json:"machine"`
	Version        string    `json:"packwire_version,omitempty"`
	Started        time.Time `json:"started"`
	Finished       time.Time `json:"finished"`
	Interrupted    bool      `json:"interrupted"`
	Notes          []string  `json:"notes,omitempty"`
}

// Machine is the client machine.
type Machine struct {
	OS          string `json:"os"`
	Arch        string `json:"arch"`
	CPUs        int    `json:"cpus"`
	CPUModel    string `json:"cpu_model,omitempty"`
	Kernel      string `json:"kernel,omitempty"`
	Hostname    string `json:"hostname,omitempty"`
	MemoryBytes int64  `json:"memory_bytes,omitempty"`
}

// Phase is one scenario's timed run.
type Phase struct {
	Scenario    string    `json:"scenario"`
	Name        string    `json:"name"`
	Command     string    `json:"command"`
	Start       time.Time `json:"start"`
	End         time.Time `json:"end"`
	PrepareMS   float64   `json:"prepare_ms,omitempty"` // untimed preparation of the clones fetches go into
	Ops         int       `json:"ops"`                  // completed without error
	Errors      int       `json:"errors"`
	Canceled    int       `json:"canceled"`
	Interrupted bool      `json:"interrupted"`

	// Server CPU in the phase: the total and per completed operation; nil
	// when not measured (ServerNote says why).
	ServerCPUMS      *float64 `json:"server_cpu_ms"`
	ServerCPUPerOpMS *float64 `json:"server_cpu_per_op_ms"`
	ServerSource     string   `json:"server_source,omitempty"`
	ServerRecords    int      `json:"server_records,omitempty"`      // governor records summed
	ServerUnassigned int      `json:"server_unattributed,omitempty"` // records outside every operation (one user)
	ServerNote       string   `json:"server_note,omitempty"`

	Pushes       int `json:"pushes"`
	PushFailures int `json:"push_failures"`

	Check *Check `json:"check,omitempty"`
	Note  string `json:"note,omitempty"`
}

// Check is what the bench verified about the repository an operation left
// (user 0's first): that a shallow clone is shallow, a partial clone
// filtered, as the scenario asks.
type Check struct {
	Want           string `json:"want"`
	Shallow        bool   `json:"shallow"`
	Filter         string `json:"filter,omitempty"` // remote.origin.partialclonefilter
	Promisor       bool   `json:"promisor"`         // remote.origin.promisor
	MissingObjects int    `json:"missing_objects"`  // reachable objects not present locally
	OK             bool   `json:"ok"`               // the repository has the scenario's shape
	Error          string `json:"error,omitempty"`
}

// Sample is one operation.
type Sample struct {
	Scenario    string    `json:"scenario"`
	User        int       `json:"user"`
	Seq         int       `json:"seq"`
	Start       time.Time `json:"start"`
	WallMS      float64   `json:"wall_ms"`         // clone, or fetch
	ResetMS     *float64  `json:"reset_ms"`        // fetches: git reset --hard origin/<branch>
	Bytes       int64     `json:"bytes"`           // pack bytes received by the clone or fetch
	ResetBytes  *int64    `json:"reset_bytes"`     // fetches: pack bytes the reset's lazy fetches received
	ClientCPUMS float64   `json:"client_cpu_ms"`   // git's own CPU (and its children's), fetch and reset
	ServerCPUMS *float64  `json:"server_cpu_ms"`   // with one user: governor records within the operation
	Result      string    `json:"result"`          // ok, error, canceled
	Error       string    `json:"error,omitempty"` // git's message
	Tip         string    `json:"tip,omitempty"`   // fetches: origin/<branch> after the fetch
	EndTime     time.Time `json:"end"`
}

// Push is one push of the pusher.
type Push struct {
	Phase  string    `json:"phase"`
	Start  time.Time `json:"start"`
	End    time.Time `json:"end"` // git push returned: the server has the commit (if ok)
	WallMS float64   `json:"wall_ms"`
	Commit string    `json:"commit,omitempty"`
	Result string    `json:"result"` // ok, error, canceled
	Error  string    `json:"error,omitempty"`
}

// Pusher sums up the pushes and whether the server kept them all.
type Pusher struct {
	Pushes   int      `json:"pushes"`
	Failures int      `json:"failures"`
	Verified bool     `json:"verified"` // the final check ran
	Lost     []string `json:"lost,omitempty"`
	Tip      string   `json:"tip,omitempty"`
	Note     string   `json:"note,omitempty"`
}

// Results of an operation.
const (
	ResultOK       = "ok"
	ResultError    = "error"
	ResultCanceled = "canceled"
)

// BytesMeasure says what Sample.Bytes counts.
const BytesMeasure = "pack bytes received: the pack data git's client read from the side-band (GIT_TRACE_PACKFILE), " +
	"lazy fetches included; not the ref advertisement, negotiation or HTTP/TLS framing"

func (c *Config) fill() error {
	if c.URL == "" {
		return errors.New("no repository URL")
	}
	if c.PushURL == "" {
		c.PushURL = c.URL
	}
	if len(c.Scenarios) == 0 {
		c.Scenarios = Scenarios
	}
	if c.Users <= 0 {
		c.Users = 1
	}
	if c.Iterations < 0 {
		return errors.New("iterations must not be negative")
	}
	if c.Iterations == 0 && c.Duration <= 0 {
		c.Duration = 30 * time.Second
	}
	if c.PusherInterval < 0 {
		return errors.New("pusher interval must not be negative (0: no pusher)")
	}
	if c.Protocol < 0 || c.Protocol > 2 {
		return fmt.Errorf("git protocol version %d: want 0, 1 or 2", c.Protocol)
	}
	if c.Git == "" {
		c.Git = "git"
	}
	if c.Governor != nil && c.ServerCPU != nil {
		return errors.New("server cost comes from the governor or from a cgroup/process, not both")
	}
	return nil
}

// runner is one Run's state.
type runner struct {
	cfg    Config
	client *client
	work   string
	res    *Result
	pusher *pusher
	prog   *progress
	mu     sync.Mutex // res.Samples, res.Pushes
}

// Run measures every scenario in turn. When ctx is cancelled it stops the
// running operations and returns what was measured so far, with
// Meta.Interrupted set; an error means nothing could be measured.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	if _, err := exec.LookPath(cfg.Git); err != nil {
		return nil, fmt.Errorf("git is not installed or not on PATH (%v)", err)
	}
	parent := cfg.WorkDir
	if parent != "" {
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return nil, err
		}
	}
	work, err := os.MkdirTemp(parent, "packwire-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	secrets := []string{urlSecret(cfg.URL), urlSecret(cfg.PushURL)}
	if cfg.Governor != nil {
		secrets = append(secrets, cfg.Governor.Token)
	}
	c, err := newClient(cfg.Git, filepath.Join(work, "home"), cfg.Protocol, secrets)
	if err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, client: c, work: work, prog: &progress{w: cfg.Progress, tty: cfg.ProgressTTY}}
	r.res = &Result{Meta: r.meta()}
	r.res.Meta.Started = time.Now()

	if v, err := c.output(ctx, work, "version"); err == nil {
		r.res.Meta.GitVersion = strings.TrimPrefix(v, "git version ")
	}
	if err := r.discoverBranch(ctx); err != nil {
		return nil, err
	}
	if cfg.Governor != nil {
		if err := cfg.Governor.Probe(ctx); err != nil {
			return nil, err
		}
	}
	if cfg.ServerCPU != nil {
		if _, err := cfg.ServerCPU.CPU(); err != nil {
			return nil, fmt.Errorf("server CPU (%s): %w", cfg.ServerCPU, err)
		}
	}
	needPusher := false
	for _, s := range cfg.Scenarios {
		needPusher = needPusher || s.Fetch
	}
	if needPusher && cfg.PusherInterval > 0 {
		r.prog.status("preparing the pusher's clone")
		r.pusher = &pusher{c: c, dir: filepath.Join(work, "pusher"), url: cfg.PushURL, branch: r.res.Meta.Branch, interval: cfg.PusherInterval}
		if err := r.pusher.prepare(ctx); err != nil {
			if ctx.Err() != nil {
				return r.finish(ctx), nil
			}
			return nil, err
		}
	}

	for _, s := range cfg.Scenarios {
		if ctx.Err() != nil {
			break
		}
		r.phase(ctx, s)
	}
	return r.finish(ctx), nil
}

func (r *runner) finish(ctx context.Context) *Result {
	if r.pusher != nil {
		vctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		r.res.Pusher = r.pusher.verify(vctx)
		cancel()
		r.res.Pushes = r.pusher.pushes
	}
	r.res.Meta.Finished = time.Now()
	r.res.Meta.Interrupted = ctx.Err() != nil
	r.prog.clear()
	return r.res
}

func (r *runner) meta() Meta {
	cfg := r.cfg
	m := Meta{
		URL:          RedactURL(cfg.URL),
		Target:       cfg.Target,
		Notes:        cfg.Notes,
		Branch:       cfg.Branch,
		Protocol:     cfg.Protocol,
		Users:        cfg.Users,
		Iterations:   cfg.Iterations,
		BytesMeasure: BytesMeasure,
		Machine:      Machine{OS: runtime.GOOS, Arch: runtime.GOARCH, CPUs: runtime.NumCPU()},
	}
	if cfg.PushURL != cfg.URL {
		m.PushURL = RedactURL(cfg.PushURL)
	}
	if cfg.Iterations == 0 {
		m.Duration = cfg.Duration.String()
	}
	m.PusherInterval = "off"
	if cfg.PusherInterval > 0 {
		m.PusherInterval = cfg.PusherInterval.String()
	}
	for _, s := range cfg.Scenarios {
		m.Scenarios = append(m.Scenarios, s.ID)
	}
	switch {
	case cfg.Governor != nil:
		m.ServerCost = cfg.Governor.String() + ": git CPU (user+system) of upload-pack requests that started in the phase"
	case cfg.ServerCPU != nil:
		m.ServerCost = cfg.ServerCPU.String() + ", sampled at phase start and end (includes the pusher's pushes in fetch phases)"
	default:
		m.ServerCost = "not measured"
	}
	m.Machine.Hostname, _ = os.Hostname()
	fillMachine(&m.Machine)
	return m
}

// discoverBranch finds the branch the remote's HEAD names, unless given.
func (r *runner) discoverBranch(ctx context.Context) error {
	out, err := r.client.output(ctx, r.work, "ls-remote", "--symref", "--", r.cfg.URL, "HEAD")
	if err != nil {
		return fmt.Errorf("cannot reach %s: %v", RedactURL(r.cfg.URL), err)
	}
	if r.cfg.Branch != "" {
		return nil
	}
	for _, line := range strings.Split(out, "\n") {
		if ref, ok := strings.CutPrefix(line, "ref: refs/heads/"); ok {
			branch, _, _ := strings.Cut(ref, "\t")
			r.res.Meta.Branch = branch
			return nil
		}
	}
	return fmt.Errorf("%s has no HEAD branch to clone: pass --branch", RedactURL(r.cfg.URL))
}

// phase runs one scenario: prepare, time every user's operations, then
// account for the server's CPU.
func (r *runner) phase(ctx context.Context, s Scenario) {
	cfg := r.cfg
	ph := Phase{Scenario: s.ID, Name: s.Name, Command: s.Command()}
	userDirs := make([]string, cfg.Users)
	for u := range userDirs {
		userDirs[u] = filepath.Join(r.work, fmt.Sprintf("u%d", u))
		os.MkdirAll(userDirs[u], 0o755)
	}
	defer func() {
		for _, d := range userDirs {
			os.RemoveAll(filepath.Join(d, s.ID))
		}
	}()
	if s.Fetch {
		prep := time.Now()
		r.prog.status(fmt.Sprintf("%s: preparing %d clone(s) with %s (not timed)", s.ID, cfg.Users, strings.Join(append([]string{"git clone"}, s.Clone...), " ")))
		errs := make([]error, cfg.Users)
		var wg sync.WaitGroup
		for u := range userDirs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				args := append(append([]string{"clone", "-q"}, s.Clone...), r.branchArgs()...)
				res := r.client.run(ctx, userDirs[u], "", append(args, "--", cfg.URL, s.ID)...)
				errs[u] = res.Err
			}()
		}
		wg.Wait()
		ph.PrepareMS = ms(time.Since(prep))
		if err := errors.Join(errs...); err != nil {
			ph.Note = "preparing the clones failed: " + err.Error()
			if ph.Interrupted = ctx.Err() != nil; ph.Interrupted {
				ph.Note = "interrupted while preparing the clones"
			}
			r.res.Phases = append(r.res.Phases, ph)
			r.prog.event(fmt.Sprintf("%s %s: %s", s.ID, s.Name, ph.Note))
			return
		}
	}

	// The pusher's first push lands before the clock starts (see
	// pusher.start): every user's first fetch downloads it.
	var stopPusher func() (int, int)
	if s.Fetch && r.pusher != nil {
		r.prog.status(fmt.Sprintf("%s: pushing a commit for the fetches (not timed)", s.ID))
		stopPusher = r.pusher.start(ctx, s.ID)
	}
	var cpu0 time.Duration
	var cpuErr error
	if cfg.ServerCPU != nil {
		cpu0, cpuErr = cfg.ServerCPU.CPU()
	}
	first := len(r.res.Samples)
	ph.Start = time.Now()
	deadline := ph.Start.Add(cfg.Duration)
	var live phaseCounters
	tickDone := make(chan struct{})
	go r.showProgress(s, &ph, &live, tickDone)

	var wg sync.WaitGroup
	for u := range userDirs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				if cfg.Iterations > 0 && i >= cfg.Iterations || cfg.Iterations == 0 && !time.Now().Before(deadline) || ctx.Err() != nil {
					return
				}
				var smp Sample
				if s.Fetch {
					smp = r.fetch(ctx, s, u, i, userDirs[u], &ph)
				} else {
					smp = r.clone(ctx, s, u, i, userDirs[u], &ph)
				}
				live.add(smp)
				r.mu.Lock()
				r.res.Samples = append(r.res.Samples, smp)
				r.mu.Unlock()
			}
		}()
	}
	wg.Wait()
	ph.End = time.Now()
	var cpu1 time.Duration
	if cfg.ServerCPU != nil && cpuErr == nil {
		cpu1, cpuErr = cfg.ServerCPU.CPU()
	}
	if stopPusher != nil {
		ph.Pushes, ph.PushFailures = stopPusher()
	}
	close(tickDone)
	ph.Interrupted = ctx.Err() != nil
	samples := r.res.Samples[first:]
	for _, smp := range samples {
		switch smp.Result {
		case ResultOK:
			ph.Ops++
		case ResultError:
			ph.Errors++
		default:
			ph.Canceled++
		}
	}
	r.serverCost(ctx, &ph, samples, cpu1-cpu0, cpuErr)
	r.res.Phases = append(r.res.Phases, ph)
	r.prog.event(phaseLine(&ph, samples))
}

func (r *runner) branchArgs() []string {
	if r.cfg.Branch != "" {
		return []string{"--branch", r.cfg.Branch}
	}
	return nil
}

// clone times one clone, checks the first one's shape, and removes it.
func (r *runner) clone(ctx context.Context, s Scenario, user, seq int, userDir string, ph *Phase) Sample {
	dir := filepath.Join(userDir, s.ID)
	os.RemoveAll(dir)
	args := append(append([]string{"clone"}, s.Clone...), r.branchArgs()...)
	start := time.Now()
	res := r.client.run(ctx, userDir, filepath.Join(userDir, "pack.trace"), append(args, "--", r.cfg.URL, s.ID)...)
	smp := Sample{Scenario: s.ID, User: user, Seq: seq, Start: start, EndTime: time.Now(), WallMS: ms(res.Wall), Bytes: res.Bytes, ClientCPUMS: ms(res.CPU)}
	setResult(&smp, res.Err)
	if smp.Result == ResultOK && user == 0 && seq == 0 {
		ph.Check = r.check(ctx, s, dir)
	}
	os.RemoveAll(dir)
	return smp
}

// fetch times one fetch into the user's prepared clone and the reset after it.
func (r *runner) fetch(ctx context.Context, s Scenario, user, seq int, userDir string, ph *Phase) Sample {
	dir := filepath.Join(userDir, s.ID)
	trace := filepath.Join(userDir, "pack.trace")
	start := time.Now()
	fr := r.client.run(ctx, dir, trace, append([]string{"fetch"}, s.FetchArgs...)...)
	smp := Sample{Scenario: s.ID, User: user, Seq: seq, Start: start, WallMS: ms(fr.Wall), Bytes: fr.Bytes, ClientCPUMS: ms(fr.CPU)}
	if fr.Err != nil {
		smp.EndTime = time.Now()
		setResult(&smp, fr.Err)
		return smp
	}
	rr := r.client.run(ctx, dir, trace, "reset", "-q", "--hard", "origin/"+r.res.Meta.Branch)
	smp.EndTime = time.Now()
	reset, resetBytes := ms(rr.Wall), rr.Bytes
	smp.ResetMS, smp.ResetBytes = &reset, &resetBytes
	smp.ClientCPUMS += ms(rr.CPU)
	setResult(&smp, rr.Err)
	if smp.Result == ResultOK {
		smp.Tip, _ = r.client.output(ctx, dir, "rev-parse", "origin/"+r.res.Meta.Branch)
		if user == 0 && seq == 0 {
			ph.Check = r.check(ctx, s, dir)
		}
	}
	return smp
}

func setResult(smp *Sample, err error) {
	switch {
	case err == nil:
		smp.Result = ResultOK
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		smp.Result = ResultCanceled
	default:
		smp.Result, smp.Error = ResultError, err.Error()
	}
}

// check verifies that a clone has the scenario's shape: shallow where the
// clone or fetch used --depth, filtered (promisor remote, objects missing)
// where it used --filter. A server that ignores a filter makes a full clone
// that git accepts with only a warning; this is where it shows.
func (r *runner) check(ctx context.Context, s Scenario, dir string) *Check {
	c := &Check{}
	wantShallow := containsArg(s.Clone, "--depth") || containsArg(s.FetchArgs, "--depth")
	wantFilter := ""
	for _, a := range s.Clone {
		if f, ok := strings.CutPrefix(a, "--filter="); ok {
			wantFilter = f
		}
	}
	switch {
	case wantShallow:
		c.Want = "shallow"
	case wantFilter != "":
		c.Want = "partial, filter " + wantFilter
	default:
		c.Want = "complete"
	}
	out, err := r.client.output(ctx, dir, "rev-parse", "--is-shallow-repository")
	if err != nil {
		c.Error = err.Error()
		return c
	}
	c.Shallow = out == "true"
	c.Filter, _ = r.client.output(ctx, dir, "config", "--get", "remote.origin.partialclonefilter")
	promisor, _ := r.client.output(ctx, dir, "config", "--get", "remote.origin.promisor")
	c.Promisor = promisor == "true"
	listing := r.client.run(ctx, dir, "", "rev-list", "--objects", "--all", "--missing=print")
	if listing.Err != nil {
		c.Error = listing.Err.Error()
		return c
	}
	for _, line := range strings.Split(listing.Stdout, "\n") {
		if strings.HasPrefix(line, "?") {
			c.MissingObjects++
		}
	}
	// A filtered clone of any history with more than one version of a
	// file lacks objects; git records the filter and the promisor remote
	// even when the server ignored the filter (it only warns), so missing
	// objects are the evidence that the server filtered.
	c.OK = c.Shallow == wantShallow && c.Filter == wantFilter && c.Promisor == (wantFilter != "") &&
		(wantFilter == "" && c.MissingObjects == 0 || wantFilter != "" && c.MissingObjects > 0)
	return c
}

func containsArg(args []string, a string) bool {
	for _, x := range args {
		if x == a || strings.HasPrefix(x, a+"=") {
			return true
		}
	}
	return false
}

// serverCost fills the phase's server CPU from the configured source.
func (r *runner) serverCost(ctx context.Context, ph *Phase, samples []Sample, sampled time.Duration, sampleErr error) {
	cfg := r.cfg
	perOp := func(total float64) {
		ph.ServerCPUMS = &total
		if ph.Ops > 0 {
			v := total / float64(ph.Ops)
			ph.ServerCPUPerOpMS = &v
		}
	}
	switch {
	case cfg.Governor != nil:
		ph.ServerSource = cfg.Governor.String()
		// The records must be read even after Ctrl-C: they are measured.
		gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		r.prog.status(fmt.Sprintf("%s: reading the governor's records", ph.Scenario))
		recs, err := cfg.Governor.Window(gctx, ph.Start, ph.End, cfg.GovernorSettle)
		if err != nil {
			ph.ServerNote = "not measured: " + err.Error()
			return
		}
		var total float64
		for _, rec := range recs {
			total += ms(rec.CPU())
		}
		ph.ServerRecords = len(recs)
		perOp(total)
		if cfg.Users != 1 {
			return
		}
		// One user: operations do not overlap, so each request belongs to
		// the operation whose time window holds its start.
		for i := range samples {
			zero := 0.0
			samples[i].ServerCPUMS = &zero
		}
		for _, rec := range recs {
			assigned := false
			for i := range samples {
				if !rec.Start.Before(samples[i].Start) && !rec.Start.After(samples[i].EndTime) {
					*samples[i].ServerCPUMS += ms(rec.CPU())
					assigned = true
					break
				}
			}
			if !assigned {
				ph.ServerUnassigned++
			}
		}
	case cfg.ServerCPU != nil:
		ph.ServerSource = cfg.ServerCPU.String()
		if sampleErr != nil {
			ph.ServerNote = "not measured: " + sampleErr.Error()
			return
		}
		perOp(ms(sampled))
	default:
		ph.ServerNote = "not measured (no governor, --server-cgroup or --server-pid)"
	}
}

// phaseCounters feed the progress line.
type phaseCounters struct {
	ops, errs atomic.Int64
	lastMS    atomic.Int64 // microseconds, to keep precision
}

func (p *phaseCounters) add(s Sample) {
	if s.Result == ResultError {
		p.errs.Add(1)
	} else if s.Result == ResultOK {
		p.ops.Add(1)
		p.lastMS.Store(int64(s.WallMS * 1000))
	}
}

func (r *runner) showProgress(s Scenario, ph *Phase, live *phaseCounters, done <-chan struct{}) {
	every := 250 * time.Millisecond
	if !r.prog.tty {
		every = 5 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		line := fmt.Sprintf("%s %s: %s", s.ID, s.Name, time.Since(ph.Start).Truncate(100*time.Millisecond))
		if r.cfg.Iterations == 0 {
			line += "/" + r.cfg.Duration.String()
		}
		line += fmt.Sprintf("  ops %d  errors %d", live.ops.Load(), live.errs.Load())
		if v := live.lastMS.Load(); v > 0 {
			line += "  last " + fmtMS(float64(v)/1000)
		}
		if s.Fetch && r.pusher != nil {
			p, f := r.pusher.counts()
			line += fmt.Sprintf("  pushes %d (failed %d)", p, f)
		}
		r.prog.status(line)
		select {
		case <-done:
			return
		case <-t.C:
		}
	}
}

func phaseLine(ph *Phase, samples []Sample) string {
	var walls []float64
	for _, s := range samples {
		if s.Result == ResultOK {
			walls = append(walls, s.WallMS)
		}
	}
	line := fmt.Sprintf("%-3s %-34s %4d ops, %d errors", ph.Scenario, ph.Name, ph.Ops, ph.Errors)
	if len(walls) > 0 {
		line += ", median " + fmtMS(compare.Median(walls))
	}
	if ph.ServerCPUPerOpMS != nil {
		line += ", server CPU " + fmtMS(*ph.ServerCPUPerOpMS) + "/op"
	}
	if ph.Pushes+ph.PushFailures > 0 {
		line += fmt.Sprintf(", %d pushes (%d failed)", ph.Pushes, ph.PushFailures)
	}
	if ph.Check != nil && !ph.Check.OK {
		line += ", SHAPE CHECK FAILED (want " + ph.Check.Want + ")"
	}
	if ph.Note != "" {
		line += ", " + ph.Note
	}
	return line
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func fmtMS(v float64) string {
	switch {
	case v >= 10_000:
		return fmt.Sprintf("%.1f s", v/1000)
	case v >= 1000:
		return fmt.Sprintf("%.2f s", v/1000)
	case v >= 10:
		return fmt.Sprintf("%.0f ms", v)
	}
	return fmt.Sprintf("%.1f ms", v)
}
