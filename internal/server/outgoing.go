package server

import (
	"context"
	"time"

	"packwire/internal/mirror"
	"packwire/internal/outbox"
	"packwire/internal/pipeline"
	"packwire/internal/store"
	"packwire/internal/webhook"
)

// openOutgoing wires what packwire sends out: pushes refused on read-only
// mirrors, acknowledged pushes published to the outbox (matching webhooks,
// the repository's push mirrors), the delivery loop and the pull mirrors'
// scheduler, started by startOutgoing.
func (s *Server) openOutgoing() {
	cfg := s.Config
	st := s.Data.Store
	s.Outbox = &outbox.Loop{
		Store: st,
		Kinds: map[string]outbox.Kind{
			store.KindWebhook:    {Sender: &webhook.Sender{Store: st, UserAgent: "packwire-hookshot"}, Timeout: cfg.HookTimeout},
			store.KindPushMirror: {Sender: &mirror.Pusher{Root: s.Data.Repos, Record: s.Governor.Record, Log: cfg.Log}, Timeout: cfg.MirrorPushTimeout, Coalesce: true},
		},
		Concurrency: cfg.DeliveryConcurrency,
		MinBackoff:  cfg.DeliveryMinBackoff,
		MaxBackoff:  cfg.DeliveryMaxBackoff,
		GiveUpAfter: cfg.DeliveryGiveUp,
		Poll:        cfg.DeliveryPoll,
		Log:         cfg.Log,
	}
	s.Publisher = &outbox.Publisher{Store: st, Sources: []outbox.Source{webhook.Source(st), mirror.Source(s.Data.Repos)}, Wake: s.Outbox.Wake}
	s.Mirrors = &mirror.Syncer{Record: s.Governor.Record, Publish: s.Publisher.Publish, Log: cfg.Log}
	s.Pipeline.PushRefusal = mirror.ReadOnlyRefusal
	s.Pipeline.OnPush = s.publishPush
}

// publishPush queues what an acknowledged push sends on: one insert.
func (s *Server) publishPush(ctx context.Context, ev pipeline.PushEvent) {
	refs := make([]outbox.RefUpdate, len(ev.Refs))
	for i, c := range ev.Refs {
		refs[i] = outbox.RefUpdate{Ref: c.Ref, Old: c.Old, New: c.New}
	}
	e := outbox.Event{Type: outbox.RefsChanged, Repo: ev.Repo.Name, User: ev.User, Transport: ev.Transport, Time: time.Now(), Refs: refs}
	if err := s.Publisher.Publish(ctx, e); err != nil {
		outbox.LogPublishError(s.Config.Log, e, err)
	}
}

// startOutgoing runs the delivery loop and the pull mirrors' scheduler
// until Shutdown.
func (s *Server) startOutgoing() {
	ctx, cancel := context.WithCancel(context.Background())
	s.stopOutgoing = cancel
	s.wg.Add(1)
	go func() { defer s.wg.Done(); s.Outbox.Run(ctx) }()
	if s.Config.MirrorCheck > 0 {
		sched := &mirror.Scheduler{Syncer: s.Mirrors, Repos: s.Data.Repos.List, Check: s.Config.MirrorCheck, Log: s.Config.Log}
		s.wg.Add(1)
		go func() { defer s.wg.Done(); sched.Run(ctx) }()
	}
}
