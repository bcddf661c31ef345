package mirror

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"packwire/internal/governor"
	"packwire/internal/outbox"
	"packwire/internal/repo"
	"packwire/internal/store"
)

// DefaultPushTimeout bounds one push to a push mirror.
const DefaultPushTimeout = 10 * time.Minute

// PushTarget names a push mirror as an outbox target: "REPO#ID".
func PushTarget(repoName string, id int) string { return repoName + "#" + strconv.Itoa(id) }

// TargetRepo is the repository of a push mirror target.
func TargetRepo(target string) string {
	name, _, _ := parseTarget(target)
	return name
}

// parseTarget splits a push mirror target.
func parseTarget(target string) (repoName string, id int, err error) {
	i := strings.LastIndexByte(target, '#')
	if i < 0 {
		return "", 0, fmt.Errorf("bad push mirror target %q", target)
	}
	id, err = strconv.Atoi(target[i+1:])
	return target[:i], id, err
}

// Source returns the outbox source of push mirror deliveries: one per
// push mirror of the repository whose refs changed. Each is a whole
// mirror push when it runs, so the payload only says what set it off.
func Source(root repo.Root) outbox.Source {
	return func(ctx context.Context, ev outbox.Event) ([]store.NewDelivery, error) {
		if ev.Type != outbox.RefsChanged {
			return nil, nil
		}
		r, err := root.Resolve(ev.Repo)
		if err != nil {
			return nil, nil // gone meanwhile: nothing to send
		}
		cfg, err := ReadConfig(r)
		if err != nil || len(cfg.Pushes) == 0 {
			return nil, err
		}
		refs := make([]string, len(ev.Refs))
		for i, u := range ev.Refs {
			refs[i] = u.Ref
		}
		payload, err := json.Marshal(map[string]any{"refs": refs, "pusher": ev.User, "transport": ev.Transport})
		if err != nil {
			return nil, err
		}
		ds := make([]store.NewDelivery, 0, len(cfg.Pushes))
		for _, p := range cfg.Pushes {
			ds = append(ds, store.NewDelivery{Kind: store.KindPushMirror, Target: PushTarget(r.Name, p.ID), Repo: r.Name, Event: "push", Payload: payload})
		}
		return ds, nil
	}
}

// Pusher sends a repository to a push mirror: the outbox Sender of
// push-mirror deliveries (with Kind.Coalesce: one push sends every ref).
type Pusher struct {
	Root repo.Root
	// Record, if set, gets one governor record per push (kind mirror-push).
	Record func(governor.Record)
	Log    *slog.Logger
}

// Send runs `git push --mirror` to the push mirror's remote: every ref is
// forced to the repository's value and refs it no longer has are deleted.
func (p *Pusher) Send(ctx context.Context, d store.Delivery) outbox.Result {
	name, id, err := parseTarget(d.Target)
	if err != nil {
		return outbox.Result{Err: err, Permanent: true}
	}
	r, err := p.Root.Resolve(name)
	if errors.Is(err, repo.ErrNotFound) || errors.Is(err, repo.ErrInvalidName) {
		return outbox.Result{Err: fmt.Errorf("repository %s not found (deleted or renamed since the push)", name), Permanent: true}
	}
	if err != nil {
		return outbox.Result{Err: err}
	}
	cfg, err := ReadConfig(r)
	if err != nil {
		return outbox.Result{Err: err}
	}
	pm, ok := cfg.Push(id)
	if !ok {
		return outbox.Result{Err: fmt.Errorf("push mirror %d of %s was removed", id, name), Permanent: true}
	}
	creds, err := credentialsOf(r, pm.Remote)
	if err != nil {
		return outbox.Result{Err: err}
	}
	start := time.Now()
	auth, env := gitAuth(pm.URL, creds)
	// By remote name: the URL comes from the config, credentials from the
	// helper, so neither is on a command line.
	args := append(auth, "--git-dir="+r.Path, "push", "--mirror", "--quiet", pm.Remote)
	run, err := git(ctx, "", env, args...)
	if err != nil && ctx.Err() == nil {
		err = errors.New(scrub(err.Error(), creds))
	}
	if p.Record != nil {
		rec := governor.Record{ID: governor.NewID(start), Start: start, Transport: Transport, Repo: r.Name, Remote: Redact(pm.URL),
			Service: "git-push", Kind: KindPush, Wall: governor.Duration(time.Since(start)),
			UserCPU: governor.Duration(run.usage.UserCPU), SysCPU: governor.Duration(run.usage.SysCPU), MaxRSS: run.usage.MaxRSS, Result: governor.ResultOK}
		switch {
		case err != nil && ctx.Err() != nil:
			rec.Result, rec.Error = governor.ResultKilled, err.Error()
		case err != nil:
			rec.Result, rec.Error = governor.ResultGitError, err.Error()
		}
		p.Record(rec)
	}
	return outbox.Result{Err: err}
}
