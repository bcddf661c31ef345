// Package outbox is what packwire owes the outside world once refs moved
// or a repository was created: webhook payloads (internal/webhook) and
// push-mirror pushes (internal/mirror). An Event becomes one delivery per
// target, queued in the store in one insert (Publisher); the server's
// Loop delivers them with bounded concurrency, one attempt in flight per
// target, a timeout per attempt and exponential backoff, and keeps every
// attempt's status, error and latency. Deliveries are rows, so pending
// ones and their retries survive a restart; delivery is at least once
// (an attempt cut by a shutdown is made again), with the same delivery id.
package outbox

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"packwire/internal/store"
)

// Event types.
const (
	// RefsChanged: a push was acknowledged, or a pull mirror's sync
	// applied, and wrote Refs.
	RefsChanged = "refs-changed"
	// RepoCreated: packwire repo create or repo import made a repository.
	RepoCreated = "repo-created"
)

// Event is something that happened to a repository.
type Event struct {
	Type      string
	Repo      string
	User      string // who pushed or created it; "": anonymous, or the admin command line
	Transport string // http, ssh, git, mirror (a pull mirror's sync), cli
	Time      time.Time
	Refs      []RefUpdate // RefsChanged: the refs written, in the client's order
	Source    string      // RepoCreated by import: where from, without credentials
	Mirror    bool        // RepoCreated: a read-only pull mirror
}

// RefUpdate is one ref an event wrote.
type RefUpdate struct {
	Ref, Old, New string
}

// Created reports whether the ref did not exist before (old id zero).
func (u RefUpdate) Created() bool { return isZero(u.Old) }

// Deleted reports whether the ref was deleted (new id zero).
func (u RefUpdate) Deleted() bool { return isZero(u.New) }

func isZero(id string) bool { return strings.Trim(id, "0") == "" }

// Source turns an event into deliveries for the targets it knows about
// (matching webhooks, a repository's push mirrors).
type Source func(ctx context.Context, ev Event) ([]store.NewDelivery, error)

// Publisher queues an event's deliveries from every source.
type Publisher struct {
	Store   *store.Store
	Sources []Source
	// Wake, if set, tells the delivery loop in this process that there is
	// work (the server's Loop.Wake); otherwise the loop finds the rows
	// when it next polls (the command line's publishes).
	Wake func()
}

// Publish queues ev's deliveries in one insert (none when no target
// wants it). It is called in a push's request path: the sources only read
// a few rows and the repository's config file.
func (p *Publisher) Publish(ctx context.Context, ev Event) error {
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	var all []store.NewDelivery
	for _, src := range p.Sources {
		ds, err := src(ctx, ev)
		if err != nil {
			return err
		}
		all = append(all, ds...)
	}
	if len(all) == 0 {
		return nil
	}
	if err := p.Store.EnqueueDeliveries(ctx, all); err != nil {
		return err
	}
	if p.Wake != nil {
		p.Wake()
	}
	return nil
}

// LogPublishError logs a failed publish the same way everywhere: the
// event is lost, which the admin must hear of.
func LogPublishError(log *slog.Logger, ev Event, err error) {
	log.Error("outbox: event not queued: webhooks and push mirrors will not hear of it", "event", ev.Type, "repo", ev.Repo, "error", err.Error())
}
