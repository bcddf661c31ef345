package dashboard

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"packwire/internal/mirror"
	"packwire/internal/store"
	"packwire/internal/webhook"
)

// recentDeliveries is how many outgoing deliveries the Repos page lists.
const recentDeliveries = 20

// deliveryRow is one webhook or push mirror delivery, as the Repos page
// shows it: where to (credentials removed), how it stands, its last
// attempt.
type deliveryRow struct {
	ID         int64
	Kind       string
	To         string
	Repo       string
	Event      string
	State      string
	Attempts   int
	LastStatus int
	LastError  string
	Latency    time.Duration
	Created    time.Time
	Next       time.Time // a pending retry
}

// deliveries reads the newest outgoing deliveries (nil if the store is
// not there or fails: the page shows the rest).
func (h *Handler) deliveries(ctx context.Context) []deliveryRow {
	if h.Access == nil || h.Access.Store == nil {
		return nil
	}
	st := h.Access.Store
	ds, err := st.Deliveries(ctx, store.DeliveryFilter{Limit: recentDeliveries})
	if err != nil {
		h.log().Warn("dashboard: reading deliveries", "error", err.Error())
		return nil
	}
	hooks := map[string]string{}
	if hs, err := st.Hooks(ctx); err == nil {
		for _, hk := range hs {
			hooks[strconv.FormatInt(hk.ID, 10)] = webhook.RedactURL(hk.URL)
		}
	}
	rows := make([]deliveryRow, 0, len(ds))
	for _, d := range ds {
		row := deliveryRow{ID: d.ID, Kind: d.Kind, Repo: d.Repo, Event: d.Event, State: d.State, Attempts: d.Attempts,
			LastStatus: d.LastStatus, LastError: d.LastError, Latency: d.LastLatency, Created: d.Created}
		if d.State == store.DeliveryPending {
			row.Next = d.NextAttempt
		}
		switch d.Kind {
		case store.KindWebhook:
			row.To = fmt.Sprintf("hook %s %s", d.Target, hooks[d.Target])
		case store.KindPushMirror:
			row.To = "push mirror " + d.Target
			if r, err := h.Repos.Resolve(d.Repo); err == nil {
				if cfg, err := mirror.ReadConfig(r); err == nil {
					for _, p := range cfg.Pushes {
						if mirror.PushTarget(r.Name, p.ID) == d.Target {
							row.To += " " + mirror.Redact(p.URL)
						}
					}
				}
			}
		default:
			row.To = d.Target
		}
		rows = append(rows, row)
	}
	return rows
}
