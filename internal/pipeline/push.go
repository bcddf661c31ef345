package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"packwire/internal/access"
	"packwire/internal/gitexec"
	"packwire/internal/push"
)

// Reasons shown to the client for refused refs, in git's report.
const (
	reasonForceDenied = "protected: force-push denied"
	// A force-allowed ref in a push that also carries force-denied refs:
	// receive.denyNonFastForwards applies to the whole push.
	reasonForceMixed = "non-fast-forward: this push also updates refs where force-push is denied; force-push this ref separately"
	reasonAtomic     = "atomic push failure"
)

func refusedReason(op access.RefOp) string { return "protected: " + string(op) + " denied" }

// runPush serves a push statelessly, whatever the transport: for a
// stateful transport (SSH) it first sends the advertisement from
// "receive-pack --stateless-rpc --advertise-refs"; then it reads the
// client's commands itself, decides each ref against the ref rules, and
// feeds receive-pack --stateless-rpc only the allowed ones followed by the
// rest of the client's stream, rewriting receive-pack's report so that
// refused refs show their reason. One receive-pack spawn per push (two
// processes over SSH counting the advertisement), none per ref.
func (c *Call) runPush(ctx context.Context, spec gitexec.Spec, stdin io.Reader, stdout, stderr io.Writer) (gitexec.Result, error) {
	p := c.p
	req := c.Request
	var total gitexec.Result
	if !req.StatelessRPC {
		adv := spec
		adv.StatelessRPC, adv.AdvertiseRefs = true, true
		res, err := p.Runner.Run(ctx, adv, bytes.NewReader(nil), stdout, stderr)
		total = res
		if err != nil || res.ExitCode != 0 {
			return total, err
		}
	}
	spec.StatelessRPC = true

	// The client's stream is read through one buffer: ReadRequest stops at
	// the pack, and the pack is relayed from the same buffer.
	activity := newActivityReader(stdin)
	in := push.BufferedReader(activity)
	var preq *push.Request
	err := watched(ctx, p.Runner.IdleTimeout, activity, func() error {
		var err error
		preq, err = push.ReadRequest(in)
		return err
	})
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
		return total, err
	}

	model := c.model
	if model == nil {
		if model, err = p.Access.Load(ctx, req.Principal); err != nil {
			return total, err
		}
	}
	var (
		kept        []push.Command
		refused     = map[string]string{}
		ffOnly      = map[string]bool{} // updates allowed to fast-forward only
		forceAllow  = map[string]bool{} // updates allowed to force
		refs        = make([]string, 0, len(preq.Commands))
		anyRefusals bool
	)
	for _, cmd := range preq.Commands {
		refs = append(refs, cmd.Ref)
		var op access.RefOp
		switch {
		case cmd.IsCreate() && cmd.IsDelete():
			kept = append(kept, cmd) // invalid; receive-pack says so
			continue
		case cmd.IsDelete():
			op = access.OpDelete
		case cmd.IsCreate():
			op = access.OpCreate
		default:
			op = access.OpPush
		}
		d := model.DecideRef(req.Principal, c.Repo.Name, cmd.Ref, op)
		if d.Allowed && op == access.OpPush {
			force := model.DecideRef(req.Principal, c.Repo.Name, cmd.Ref, access.OpForce)
			if force.Allowed {
				forceAllow[cmd.Ref] = true
			} else {
				ffOnly[cmd.Ref] = true
			}
		}
		if !d.Allowed {
			anyRefusals = true
			refused[cmd.Ref] = refusedReason(op)
			c.logRefusedRef(cmd.Ref, op, d)
			continue
		}
		kept = append(kept, cmd)
	}

	atomic := preq.HasCap("atomic")
	if atomic && anyRefusals {
		for _, cmd := range kept {
			refused[cmd.Ref] = reasonAtomic
		}
		kept = nil
		p.log().Info("refused", "id", c.ID, "transport", req.Transport, "repo", c.Repo.Name, "user", req.Principal.String(),
			"reason", "atomic push with refused refs: nothing written")
	}
	rewrite := &push.Rewrite{Refs: refs, Refused: refused, Reason: func(ref, reason string) string {
		if reason == "non-fast-forward" && ffOnly[ref] {
			c.logRefusedRef(ref, access.OpForce, model.DecideRef(req.Principal, c.Repo.Name, ref, access.OpForce))
			return reasonForceDenied
		}
		if reason == "non-fast-forward" && forceAllow[ref] && len(ffOnly) > 0 {
			return reasonForceMixed
		}
		return reason
	}}
	sideband := preq.Sideband()

	if len(kept) == 0 {
		// Every ref refused: receive-pack is not spawned. The pack the
		// client sends anyway is read and dropped so that it never blocks.
		if preq.NeedsPack() {
			var n int64
			err := watched(ctx, p.Runner.IdleTimeout, activity, func() error {
				var err error
				n, err = io.Copy(io.Discard, in)
				return err
			})
			total.BytesIn += n
			if ctx.Err() != nil || errors.Is(err, gitexec.ErrIdle) {
				return total, err
			}
		}
		if preq.Reports() {
			out := push.Encode(rewrite.Apply(nil), sideband)
			n, err := stdout.Write(out)
			total.BytesOut += int64(n)
			if err != nil {
				return total, gitexec.ErrClientGone
			}
		}
		return total, nil
	}

	if len(ffOnly) > 0 {
		// git checks fast-forward itself, per ref, once the pack is in.
		spec.Config = append(spec.Config, "receive.denyNonFastForwards=true")
	}
	var out io.Writer = stdout
	var rw *push.ReportWriter
	if preq.Reports() {
		rw = push.NewReportWriter(stdout, sideband, rewrite)
		out = rw
	}
	body := io.MultiReader(bytes.NewReader(preq.Encode(kept)), in)
	res, err := p.Runner.Run(ctx, spec, body, out, stderr)
	if rw != nil && err == nil {
		if ferr := rw.Finish(); ferr != nil {
			err = gitexec.ErrClientGone
		}
	}
	res.BytesIn += total.BytesIn
	res.BytesOut += total.BytesOut
	res.UserCPU += total.UserCPU
	res.SysCPU += total.SysCPU
	res.MaxRSS = max(res.MaxRSS, total.MaxRSS)
	return res, err
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
