package pipeline

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"packwire/internal/access"
	"packwire/internal/gitexec"
	"packwire/internal/governor"
	"packwire/internal/hookmode"
	"packwire/internal/push"
	"packwire/internal/pushguard"
	"packwire/internal/repo"
	"packwire/internal/repolock"
	"packwire/internal/units"
)

// Reasons shown to the client for refused refs, in git's report.
const (
	reasonForceDenied = pushguard.ForceDenied
	reasonAtomic      = "atomic push failure"
	// Old and new both zero: git's receive-pack would delete the ref
	// whatever it points at (it takes a zero old id for a corrupt ref).
	reasonZeroCommand = "invalid command: old and new object ids are both zero"
	reasonDuplicate   = "invalid command: this ref is named more than once in the push"
)

func refusedReason(op access.RefOp) string { return "protected: " + string(op) + " denied" }

// DefaultMaxPushRefs bounds the ref updates of one push when
// Pipeline.MaxPushRefs is 0: a 5,000-ref mirror push is the largest the
// field notes name; each command held costs a few hundred bytes.
const DefaultMaxPushRefs = 100_000

// maxSkippedInflate bounds the bytes inflated while skipping the pack of a
// push refused whole, beyond push.InflateRatio times what the client sent.
const maxSkippedInflate = 256 << 20

// pushPlan is what packwire decided for each command of a push before
// receive-pack sees it.
type pushPlan struct {
	kept    []push.Command
	refused map[string]string // ref -> reason, never given to receive-pack
	ffOnly  []string          // kept updates allowed only as fast-forwards
	refs    []string          // every ref of the request, in its order
}

// runPush serves a push statelessly, whatever the transport: for a
// stateful transport (SSH) it first sends the advertisement from
// "receive-pack --stateless-rpc --advertise-refs"; then it reads the
// client's commands itself, decides each ref against the ref rules, and
// feeds receive-pack --stateless-rpc only the allowed ones followed by the
// rest of the client's stream. Updates allowed only as fast-forwards go
// through receive-pack's proc-receive hook (internal/pushguard), which
// checks ancestry once the objects are in, in every ref namespace. The
// report is rewritten so that refused refs show their reason.
func (c *Call) runPush(ctx context.Context, spec gitexec.Spec, stdin io.Reader, stdout, stderr io.Writer) (gitexec.Result, error) {
	p := c.p
	req := c.Request
	var total gitexec.Result
	if !req.StatelessRPC {
		adv := spec
		adv.StatelessRPC, adv.AdvertiseRefs = true, true
		res, err := c.startGit(ctx, adv, bytes.NewReader(nil), stdout, stderr)
		total = res
		if err != nil || res.ExitCode != 0 {
			return total, err
		}
	}
	spec.StatelessRPC = true

	// The client's stream is read through one buffer: ReadRequest stops at
	// the pack, and the pack is relayed (or skipped) from the same buffer.
	// Both are paced (pushpace.go): the watch cancels ctx when the client
	// falls behind.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	sent := &pushStream{r: stdin}
	activity := newActivityReader(sent)
	in := push.BufferedReader(activity)
	var preq *push.Request
	commandsStart := time.Now()
	stopCommandsPace := paceWatch(c.timeouts.Pace, commandsStart, &sent.n, cancel)
	err := watched(ctx, c.timeouts.Idle, activity, func() error {
		var err error
		preq, err = push.ReadRequest(in, p.maxPushRefs())
		return err
	})
	if stopCommandsPace() {
		return total, c.refusePush(c.timeouts.Pace.slowError(sent.n.Load()-int64(in.Buffered()), time.Since(commandsStart)), stderr)
	}
	if ctx.Err() != nil || errors.Is(err, gitexec.ErrIdle) {
		return total, err
	}
	if errors.Is(err, push.ErrNoCommands) {
		return total, nil // ls-remote style, or nothing to push
	}
	if err != nil {
		p.log().Info("refused", "id", c.ID, "transport", req.Transport, "repo", c.Repo.Name, "user", req.Principal.String(), "reason", err.Error())
		if stderr != nil {
			fmt.Fprintf(stderr, "fatal: %s\n", err)
		}
		total.ExitCode = 128
		return total, &Error{Code: CodeBadRequest, Message: err.Error(), Err: err}
	}

	model := c.model
	if model == nil {
		if model, err = p.Access.Load(ctx, req.Principal); err != nil {
			return total, err
		}
	}
	plan := c.planPush(model, preq)
	maxInput, quotaErr := c.pushRoom()
	if quotaErr != "" {
		// Deletes free room: only what brings objects is refused.
		var kept []push.Command
		for _, cmd := range plan.kept {
			if cmd.IsDelete() {
				kept = append(kept, cmd)
				continue
			}
			plan.refused[cmd.Ref] = quotaErr
		}
		plan.kept = kept
		plan.ffOnly = nil
		p.log().Info("refused", "id", c.ID, "transport", req.Transport, "repo", c.Repo.Name, "user", req.Principal.String(), "reason", quotaErr)
	}
	atomicPush := preq.HasCap("atomic")
	if atomicPush && len(plan.refused) > 0 && len(plan.kept) > 0 {
		for _, cmd := range plan.kept {
			plan.refused[cmd.Ref] = reasonAtomic
		}
		plan.kept, plan.ffOnly = nil, nil
		p.log().Info("refused", "id", c.ID, "transport", req.Transport, "repo", c.Repo.Name, "user", req.Principal.String(),
			"reason", "atomic push with refused refs: nothing written")
	}
	var pack *packPace
	if preq.NeedsPack() {
		// Nothing is held for the pack before it comes: git may count and
		// compress objects for a while first. From its first byte it is paced.
		err := watched(ctx, c.timeouts.Idle, activity, func() error {
			_, err := in.Peek(1)
			return err
		})
		if ctx.Err() != nil || errors.Is(err, gitexec.ErrIdle) {
			return total, err
		}
		pack = sent.pacePack(c.timeouts.Pace, in.Buffered(), cancel)
	}
	slowPack := func(res gitexec.Result, err error) (gitexec.Result, error) {
		if pack.cutOff() {
			return res, c.refusePush(pack.slowError(), stderr)
		}
		return res, err
	}
	if len(plan.kept) > 0 {
		// Admitted once its commands are known and before receive-pack
		// takes the pack: a push that will write nothing takes no slot.
		// One user's pushes take at most their share (Pushes.PerClient).
		if err := c.admitNow(ctx, p.Pushes); err != nil {
			var perr *Error
			msg := err.Error()
			if errors.As(err, &perr) {
				msg = perr.Message
			}
			for _, cmd := range plan.kept {
				plan.refused[cmd.Ref] = msg
			}
			plan.kept, plan.ffOnly = nil, nil
			c.pushBusy = true
			p.log().Info("refused", "id", c.ID, "transport", req.Transport, "repo", c.Repo.Name, "user", req.Principal.String(), "reason", msg)
		}
	}
	ffOnly := map[string]bool{}
	for _, ref := range plan.ffOnly {
		ffOnly[ref] = true
	}
	rewrite := &push.Rewrite{Refs: plan.refs, Refused: plan.refused, Reason: func(ref, reason string) string {
		switch {
		case reason == reasonForceDenied && ffOnly[ref]:
			c.logRefusedRef(ref, access.OpForce, model.DecideRef(req.Principal, c.Repo.Name, ref, access.OpForce))
		case atomicPush && reason == "fail to run proc-receive hook":
			// Innocent refs of an atomic push the hook refused part of.
			return reasonAtomic
		}
		return reason
	}}
	sideband := preq.Sideband()

	if len(plan.kept) == 0 {
		res, err := c.refuseWholePush(ctx, preq, in, activity, rewrite, sideband, stdout)
		res.BytesIn += total.BytesIn
		res.BytesOut += total.BytesOut
		return slowPack(res, err)
	}

	// The repository stays where it is until the push has ended: repo
	// delete and rename, run by another process, refuse meanwhile.
	moveLock, err := c.holdRepo(ctx, stderr)
	if err != nil {
		return total, err
	}
	defer moveLock.Release()

	if p.FsckPushes {
		// git's own checks of what is pushed; its messages reach the client.
		spec.Config = append(spec.Config, "receive.fsckObjects=true")
	}
	if maxInput > 0 {
		spec.Config = append(spec.Config, "receive.maxInputSize="+strconv.FormatInt(maxInput, 10))
	}
	if len(plan.ffOnly) > 0 {
		if p.HooksDir == "" {
			return total, &Error{Code: CodeInternal, Message: "internal error: fast-forward checks are not set up", Err: errors.New("pipeline: no HooksDir")}
		}
		list, err := pushguard.WriteRefs(p.HooksDir, plan.ffOnly)
		if err != nil {
			return total, &Error{Code: CodeInternal, Message: "internal error preparing the push", Err: err}
		}
		defer os.Remove(list)
		spec.Config = append(spec.Config, pushguard.Config(p.HooksDir)...)
		spec.Env = append(spec.Env, hookmode.Env+"="+hookmode.ProcReceive, pushguard.EnvFFOnly+"="+list)
	}
	if p.LFS != nil && p.HooksDir != "" {
		if len(plan.ffOnly) == 0 {
			spec.Config = append(spec.Config, "core.hooksPath="+p.HooksDir)
		}
		spec.Env = append(spec.Env, p.LFS.PushEnv(c.Repo.Name)...)
	}
	spec.Config = append(spec.Config, c.route.Config...)
	spec.Env = append(spec.Env, c.route.Env...)
	pushDone := func() {}
	if c.route.Push != nil {
		env, config, done := c.route.Push(plan.kept, len(plan.ffOnly) > 0)
		spec.Env, spec.Config, pushDone = append(spec.Env, env...), append(spec.Config, config...), done
	}
	var out io.Writer = stdout
	var rw *push.ReportWriter
	if preq.Reports() {
		rw = push.NewReportWriter(stdout, sideband, rewrite)
		out = rw
	}
	if pack != nil {
		out = endOnWrite{w: out, pack: pack}
	}
	body := io.MultiReader(bytes.NewReader(preq.Encode(plan.kept)), in)
	res, err := c.startGit(ctx, spec, body, out, stderr)
	pushDone()
	if pack.cutOff() {
		res.BytesIn += total.BytesIn
		res.BytesOut += total.BytesOut
		return res, c.refusePush(pack.slowError(), stderr)
	}
	if rw != nil && err == nil && res.ExitCode != 0 && !rw.Reported() && len(plan.kept) > 0 {
		// receive-pack died before its report (git 2.39 dies when a
		// reference-transaction hook refuses: the cluster's replication).
		// Every client is told why, per ref, as for a refused update, and
		// over HTTP too, where git's stderr reaches no one.
		reason := dyingReason(res.Stderr)
		lines := []string{"unpack ok"}
		for _, cmd := range plan.kept {
			lines = append(lines, "ng "+cmd.Ref+" "+reason)
		}
		rw.Write(push.Encode(lines, sideband))
	}
	if rw != nil && err == nil {
		if ferr := rw.Finish(); ferr != nil {
			err = gitexec.ErrClientGone
		}
	}
	c.pushOutcome = judgeReport(rewrite.Final, plan.refused, ffOnly)
	c.announcePush(ctx, plan.kept, rewrite.Final, res)
	if branch, err := repo.FollowFirstPush(ctx, c.Repo, createdBranches(plan.kept, rewrite.Final)); err != nil {
		p.log().Warn("HEAD not moved to the first pushed branch", "repo", c.Repo.Name, "error", err.Error())
	} else if branch != "" {
		p.log().Info("HEAD follows the first push", "repo", c.Repo.Name, "branch", branch)
		if moved := c.route.HeadMoved; moved != nil {
			if err := moved(ctx, branch); err != nil {
				p.log().Warn("HEAD moved here, not yet on the other copies", "repo", c.Repo.Name, "branch", branch, "error", err.Error())
			}
		}
	}
	res.BytesIn += total.BytesIn
	res.BytesOut += total.BytesOut
	res.UserCPU += total.UserCPU
	res.SysCPU += total.SysCPU
	res.MaxRSS = max(res.MaxRSS, total.MaxRSS)
	return res, err
}

// refusePush logs a push refused while it arrived and tells the client:
// over SSH on stderr (over HTTP the transport answers with the error's
// status, as nothing was written yet).
func (c *Call) refusePush(perr *Error, stderr io.Writer) error {
	req := c.Request
	c.p.log().Info("refused", "id", c.ID, "transport", req.Transport, "repo", c.Repo.Name, "user", req.Principal.String(), "reason", perr.Message)
	if stderr != nil {
		fmt.Fprintf(stderr, "fatal: %s\n", perr.Message)
	}
	return perr
}

// planPush decides every command of a push against the ref rules.
func (c *Call) planPush(model *access.Model, preq *push.Request) pushPlan {
	req := c.Request
	plan := pushPlan{refused: map[string]string{}, refs: make([]string, 0, len(preq.Commands))}
	named := make(map[string]int, len(preq.Commands))
	for _, cmd := range preq.Commands {
		named[cmd.Ref]++
	}
	for _, cmd := range preq.Commands {
		if named[cmd.Ref] > 1 {
			if _, done := plan.refused[cmd.Ref]; !done {
				plan.refs = append(plan.refs, cmd.Ref)
				plan.refused[cmd.Ref] = reasonDuplicate
				c.logRefusedCommand(cmd.Ref, reasonDuplicate)
			}
			continue
		}
		plan.refs = append(plan.refs, cmd.Ref)
		var op access.RefOp
		switch {
		case cmd.IsCreate() && cmd.IsDelete():
			plan.refused[cmd.Ref] = reasonZeroCommand
			c.logRefusedCommand(cmd.Ref, reasonZeroCommand)
			continue
		case cmd.IsDelete():
			op = access.OpDelete
		case cmd.IsCreate():
			op = access.OpCreate
		default:
			op = access.OpPush
		}
		d := model.DecideRef(req.Principal, c.Repo.Name, cmd.Ref, op)
		if !d.Allowed {
			plan.refused[cmd.Ref] = refusedReason(op)
			c.logRefusedRef(cmd.Ref, op, d)
			continue
		}
		if op == access.OpPush {
			force := model.DecideRef(req.Principal, c.Repo.Name, cmd.Ref, access.OpForce)
			switch {
			case force.Allowed:
			case movesTag(cmd):
				// A tag names one object for good: moving it is a rewrite
				// whatever the ancestry of its old and new commits.
				plan.refused[cmd.Ref] = refusedReason(access.OpForce)
				c.logRefusedRef(cmd.Ref, access.OpForce, force)
				continue
			default:
				plan.ffOnly = append(plan.ffOnly, cmd.Ref)
			}
		}
		plan.kept = append(plan.kept, cmd)
	}
	return plan
}

// movesTag tells an update that changes what an existing tag (a ref under
// refs/tags/) points at: a force-push for the ref rules, as git's own
// client refuses it without --force ("would clobber existing tag").
func movesTag(cmd push.Command) bool {
	return strings.HasPrefix(cmd.Ref, "refs/tags/") && !cmd.IsCreate() && !cmd.IsDelete() && !strings.EqualFold(cmd.Old, cmd.New)
}

// refuseWholePush answers a push in which no command reaches receive-pack:
// the pack the client sends anyway is read to its end (its trailer, not
// EOF: some clients keep their side open until they have the report) and
// dropped, then packwire sends the report itself.
func (c *Call) refuseWholePush(ctx context.Context, preq *push.Request, in *bufio.Reader, activity *activityReader, rewrite *push.Rewrite, sideband int, stdout io.Writer) (gitexec.Result, error) {
	var res gitexec.Result
	var report []string
	if preq.NeedsPack() {
		var n int64
		err := watched(ctx, c.timeouts.Idle, activity, func() error {
			var err error
			n, err = push.SkipPack(in, len(preq.Commands[0].Old)/2, maxSkippedInflate)
			return err
		})
		res.BytesIn += n
		switch {
		case ctx.Err() != nil || errors.Is(err, gitexec.ErrIdle):
			return res, err
		case err != nil:
			// As receive-pack reports a pack it could not take.
			report = append(report, "unpack "+oneLine(err.Error())+"\n")
			c.pushOutcome = pushOutcome{result: governor.ResultGitError, err: err.Error()}
		}
	}
	if c.pushOutcome.result == "" {
		c.pushOutcome = pushOutcome{result: governor.ResultRefused, err: "every ref refused"}
		if c.pushBusy {
			c.pushOutcome.err = "server busy"
		}
	}
	if preq.Reports() {
		out := push.Encode(rewrite.Apply(report), sideband)
		n, err := stdout.Write(out)
		res.BytesOut += int64(n)
		if err != nil {
			return res, gitexec.ErrClientGone
		}
	}
	return res, nil
}

// holdRepo takes the repository's move lock for a push, or says that the
// repository was deleted or renamed since the push began, as if it had
// never been found.
func (c *Call) holdRepo(ctx context.Context, stderr io.Writer) (*repolock.Lock, error) {
	lock, err := repolock.Shared(ctx, c.Repo.Path)
	if errors.Is(err, repolock.ErrMoved) {
		msg := fmt.Sprintf("repository '%s' not found", c.Repo.Name)
		c.p.log().Info("refused", "id", c.ID, "transport", c.Request.Transport, "repo", c.Repo.Name, "user", c.Request.Principal.String(), "reason", "moved or deleted during the push")
		if stderr != nil {
			fmt.Fprintf(stderr, "fatal: %s\n", msg)
		}
		return nil, &Error{Code: CodeNotFound, Message: msg, Err: err}
	}
	if err != nil && ctx.Err() == nil {
		return nil, &Error{Code: CodeInternal, Message: "internal error locking the repository", Err: err}
	}
	return lock, err
}

// pushRoom is the largest pack the push may send (0: no bound), from
// MaxPushBytes and the room left under the repository's quota, or why
// nothing may be pushed (the quota is used up).
func (c *Call) pushRoom() (maxInput int64, refusal string) {
	p := c.p
	maxInput = p.MaxPushBytes
	quota, err := repo.Quota(c.Repo)
	if err != nil {
		p.log().Warn("quota unreadable", "repo", c.Repo.Name, "error", err.Error())
		return maxInput, ""
	}
	if quota <= 0 {
		return maxInput, ""
	}
	used, err := repo.Usage(c.Repo)
	if err != nil {
		p.log().Warn("repository size unreadable", "repo", c.Repo.Name, "error", err.Error())
		return maxInput, ""
	}
	if p.LFSBytes != nil {
		lfsBytes, err := p.LFSBytes(context.Background(), c.Repo.Name)
		if err != nil {
			p.log().Warn("LFS size unreadable", "repo", c.Repo.Name, "error", err.Error())
		}
		used += lfsBytes
	}
	room := quota - used
	if room <= 0 {
		return 0, fmt.Sprintf("repository over its quota (%s used of %s)", units.Bytes(used), units.Bytes(quota))
	}
	if maxInput <= 0 || room < maxInput {
		maxInput = room
	}
	return maxInput, ""
}

// createdBranches are the branches a push created, by the report's "ok"
// lines (every one when the client asked for no report), in the client's
// order.
func createdBranches(kept []push.Command, report []string) []string {
	ok := map[string]bool{}
	if report == nil {
		for _, cmd := range kept {
			ok[cmd.Ref] = true
		}
	}
	for _, l := range report {
		if ref, found := strings.CutPrefix(strings.TrimSuffix(l, "\n"), "ok "); found {
			ok[ref] = true
		}
	}
	var created []string
	for _, cmd := range kept {
		if cmd.IsCreate() && strings.HasPrefix(cmd.Ref, "refs/heads/") && ok[cmd.Ref] {
			created = append(created, cmd.Ref)
		}
	}
	return created
}

// pushOutcome is how a push ended as far as its report tells; empty
// result: as git's exit says.
type pushOutcome struct {
	result string
	err    string
}

// judgeReport reads the report the client got: a pack git could not take,
// or refs git itself failed to write (a full disk: "failed to update
// ref"), make the push a git error even when receive-pack exits 0; a push
// whose every ref packwire refused is a refusal.
func judgeReport(lines []string, refused map[string]string, ffOnly map[string]bool) pushOutcome {
	var ok, ours int
	var gitFailure string
	for _, l := range lines {
		l = strings.TrimSuffix(l, "\n")
		switch {
		case strings.HasPrefix(l, "unpack "):
			if status := strings.TrimPrefix(l, "unpack "); status != "ok" {
				return pushOutcome{result: governor.ResultGitError, err: "unpack: " + status}
			}
		case strings.HasPrefix(l, "ok "):
			ok++
		case strings.HasPrefix(l, "ng "):
			ref, reason, _ := strings.Cut(l[3:], " ")
			_, byRule := refused[ref]
			if byRule || reason == reasonForceDenied && ffOnly[ref] || reason == reasonAtomic {
				ours++
			} else if gitFailure == "" {
				gitFailure = ref + ": " + reason
			}
		}
	}
	switch {
	case gitFailure != "":
		return pushOutcome{result: governor.ResultGitError, err: gitFailure}
	case ok == 0 && ours > 0:
		return pushOutcome{result: governor.ResultRefused, err: "every ref refused"}
	}
	return pushOutcome{}
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func (p *Pipeline) maxPushRefs() int {
	if p.MaxPushRefs > 0 {
		return p.MaxPushRefs
	}
	return DefaultMaxPushRefs
}

// logRefusedRef logs one refused ref with the rule that decided it.
func (c *Call) logRefusedRef(ref string, op access.RefOp, d access.RefDecision) {
	req := c.Request
	attrs := []any{"id", c.ID, "transport", req.Transport, "repo", c.Repo.Name, "user", req.Principal.String(),
		"ref", printable(ref), "op", string(op), "decided_by", d.Why()}
	if d.Rule != nil {
		attrs = append(attrs, "rule_index", d.Rule.Position, "rule", access.RuleText(*d.Rule))
	}
	c.p.log().Info("ref refused", attrs...)
}

// logRefusedCommand logs a command refused for what it is, before any rule.
func (c *Call) logRefusedCommand(ref, reason string) {
	req := c.Request
	c.p.log().Info("ref refused", "id", c.ID, "transport", req.Transport, "repo", c.Repo.Name, "user", req.Principal.String(),
		"ref", printable(ref), "reason", reason)
}

// watched runs fn, which reads the client's stream through activity,
// under the same limits as the relay: it gives up when ctx ends (client
// gone, server kill switch) or when nothing arrives for idle (0: never).
// fn is then left blocked on the client stream, which the transport closes
// when the request returns, as the relay's own client-to-git copy is.
func watched(ctx context.Context, idle time.Duration, activity *activityReader, fn func() error) error {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	var tick <-chan time.Time
	if idle > 0 {
		t := time.NewTicker(min(idle/4, time.Second))
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-tick:
			if time.Since(time.Unix(0, activity.seen.Load())) > idle {
				return gitexec.ErrIdle
			}
		}
	}
}

// activityReader records when the client last sent something.
type activityReader struct {
	r    io.Reader
	seen atomic.Int64
}

func newActivityReader(r io.Reader) *activityReader {
	a := &activityReader{r: r}
	a.seen.Store(time.Now().UnixNano())
	return a
}

func (a *activityReader) Read(p []byte) (int, error) {
	n, err := a.r.Read(p)
	if n > 0 {
		a.seen.Store(time.Now().UnixNano())
	}
	return n, err
}

// dyingReason is the line of a dying receive-pack's stderr worth showing:
// packwire's own (a hook's), else git's last.
func dyingReason(stderr string) string {
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	reason := ""
	for _, l := range lines {
		if strings.HasPrefix(l, "packwire: ") {
			reason = strings.TrimPrefix(l, "packwire: ")
			break
		}
	}
	if reason == "" && len(lines) > 0 {
		reason = strings.TrimPrefix(strings.TrimPrefix(lines[len(lines)-1], "fatal: "), "error: ")
	}
	if reason == "" {
		reason = "receive-pack failed"
	}
	if len(reason) > 300 {
		reason = reason[:300]
	}
	return reason
}
