package route

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"packwire/internal/access"
	"packwire/internal/mirror"
	"packwire/internal/outbox"
	"packwire/internal/repo"
	"packwire/internal/server/cluster"
	"packwire/internal/store"
)

// Mirrors in a cluster: a repository's mirroring and credentials are one
// of its numbered settings (every copy gets them, so that any node can
// become primary), and only the primary works with upstream or the push
// mirrors, from its copy caught up first. A pull mirror's sync runs its
// ref transaction with the cluster's hook, so it is replicated to a
// majority and committed as a generation exactly as a push is. Another
// node asks the primary over MirrorPath: repo sync on any machine, and a
// node that took a push-mirror delivery from the shared outbox.

// MirrorPath is the endpoint on every node's HTTP listener where a
// repository's primary syncs its pull mirror or pushes to a push mirror
// for another node. Only the cluster user may call it.
const MirrorPath = "/_packwire/mirror"

// MirrorCall is what MirrorPath is asked.
type MirrorCall struct {
	Action   string          `json:"action"` // "sync", "push", "state"
	Repo     string          `json:"repo"`
	Delivery *store.Delivery `json:"delivery,omitempty"` // push
}

// MirrorAnswer is MirrorPath's answer.
type MirrorAnswer struct {
	Error     string             `json:"error,omitempty"`
	Elsewhere bool               `json:"elsewhere,omitempty"` // this node is not the primary (any more)
	Permanent bool               `json:"permanent,omitempty"` // push: no retry can help
	Sync      *mirror.SyncResult `json:"sync,omitempty"`
	State     *mirror.State      `json:"state,omitempty"`
}

// ElsewhereError: the repository's primary is another node.
type ElsewhereError struct {
	Repo, Node string
}

func (e *ElsewhereError) Error() string {
	return fmt.Sprintf("node %s is the primary of %s", e.Node, e.Repo)
}

// Is makes it a mirror.ErrElsewhere.
func (e *ElsewhereError) Is(target error) bool { return target == mirror.ErrElsewhere }

// PrimaryCopy returns this node's copy of name if this node is its
// primary, caught up and with its settings applied (a mirror just added
// is in its config); an *ElsewhereError if another node is.
func (rt *Router) PrimaryCopy(ctx context.Context, name string) (repo.Repo, error) {
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	pl, err := cluster.Locate(lctx, rt.Node.DB, name, rt.Node.NodeTimeout())
	cancel()
	if errors.Is(err, cluster.ErrNotPlaced) {
		return repo.Repo{}, fmt.Errorf("repository '%s': %w", name, repo.ErrNotFound)
	}
	if err != nil {
		return repo.Repo{}, err
	}
	me := rt.Node.Name
	if pl.Primary != me {
		return repo.Repo{}, &ElsewhereError{Repo: name, Node: pl.Primary}
	}
	if !pl.UpToDate(me) || !rt.hasCopy(ctx, name) {
		if err := rt.catchUpFor(ctx, name); err != nil {
			return repo.Repo{}, err
		}
	}
	if err := rt.applySettings(ctx); err != nil {
		return repo.Repo{}, err
	}
	return rt.Repos.Resolve(name)
}

// RefTransaction is a pull mirror's sync's hook on a cluster node
// (mirror.Syncer.Transaction): the primary's copy made current, and the
// git settings and environment that make its ref transaction replicated
// before git commits it, as a push's is.
func (rt *Router) RefTransaction(ctx context.Context, r repo.Repo) (config, env []string, err error) {
	if _, err := rt.PrimaryCopy(ctx, r.Name); err != nil {
		return nil, nil, err
	}
	rt.mu.Lock()
	socket, token := rt.hookSocket, rt.hookToken
	rt.mu.Unlock()
	if socket == "" {
		return nil, nil, errors.New("cluster: the hooks' socket is not listening yet")
	}
	return []string{"core.hooksPath=" + rt.HooksDir}, rt.hookEnv(r.Name, socket, token), nil
}

// hookEnv is what the cluster's hook needs to find this node.
func (rt *Router) hookEnv(name, socket, token string) []string {
	return []string{"PACKWIRE_HOOK=" + cluster.HookName, cluster.EnvRepo + "=" + name,
		cluster.EnvSocket + "=" + socket, cluster.EnvToken + "=" + token}
}

// MirrorPusher sends push-mirror deliveries in a cluster: from this node's
// copy when it is the primary, otherwise by the primary (MirrorPath), so
// that a push mirror never gets a copy that is behind.
type MirrorPusher struct {
	Router *Router
	Local  *mirror.Pusher
}

// Send is the outbox Sender of push-mirror deliveries.
func (p *MirrorPusher) Send(ctx context.Context, d store.Delivery) outbox.Result {
	name := mirror.TargetRepo(d.Target)
	_, err := p.Router.PrimaryCopy(ctx, name)
	var elsewhere *ElsewhereError
	switch {
	case err == nil:
		return p.Local.Send(ctx, d)
	case errors.Is(err, repo.ErrNotFound):
		return outbox.Result{Err: fmt.Errorf("repository %s not found (deleted or renamed since the push)", name), Permanent: true}
	case !errors.As(err, &elsewhere):
		return outbox.Result{Err: err}
	}
	a, err := AskPrimary(ctx, p.Router.Node.DB, p.Router.Secret, p.Router.Node.NodeTimeout(), MirrorCall{Action: "push", Repo: name, Delivery: &d})
	if err != nil {
		return outbox.Result{Err: err}
	}
	if a.Error != "" {
		return outbox.Result{Err: errors.New(a.Error), Permanent: a.Permanent}
	}
	return outbox.Result{}
}

// AskPrimary makes a call to MirrorPath on the repository's primary, as
// the cluster user. A primary that moved meanwhile is asked again.
func AskPrimary(ctx context.Context, db *store.DB, secret string, timeout time.Duration, call MirrorCall) (MirrorAnswer, error) {
	body, err := json.Marshal(call)
	if err != nil {
		return MirrorAnswer{}, err
	}
	for attempt := 0; ; attempt++ {
		pl, err := cluster.Locate(ctx, db, call.Repo, timeout)
		if errors.Is(err, cluster.ErrNotPlaced) {
			return MirrorAnswer{}, fmt.Errorf("repository '%s': %w", call.Repo, repo.ErrNotFound)
		}
		if err != nil {
			return MirrorAnswer{}, err
		}
		primary, ok := pl.Replica(pl.Primary)
		if !ok || !primary.Healthy {
			return MirrorAnswer{}, fmt.Errorf("'%s' has no reachable primary right now (node %s), retry shortly", call.Repo, pl.Primary)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(primary.URL, "/")+MirrorPath, bytes.NewReader(body))
		if err != nil {
			return MirrorAnswer{}, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.SetBasicAuth(access.ClusterUser, secret)
		resp, err := replicateClient.Do(req)
		if err != nil {
			return MirrorAnswer{}, fmt.Errorf("node %s: %w", primary.Node, err)
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
		resp.Body.Close()
		var a MirrorAnswer
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &a) != nil {
			return MirrorAnswer{}, fmt.Errorf("node %s: %s: %s", primary.Node, resp.Status, strings.TrimSpace(string(b)))
		}
		if a.Elsewhere && attempt < 3 {
			time.Sleep(time.Duration(attempt+1) * 200 * time.Millisecond)
			continue
		}
		return a, nil
	}
}

// MirrorHandler serves MirrorPath: sync runs sync on this node's copy,
// push sends the delivery, state reads the pull mirror's last sync; each
// only on the repository's primary.
func MirrorHandler(rt *Router, acc *access.Controller, sync func(context.Context, repo.Repo) (mirror.SyncResult, error), push func(context.Context, store.Delivery) outbox.Result) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !fromCluster(acc, w, r) {
			return
		}
		var call MirrorCall
		if r.Method != http.MethodPost || json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&call) != nil {
			http.Error(w, "a JSON MirrorCall by POST", http.StatusBadRequest)
			return
		}
		var a MirrorAnswer
		rp, err := rt.PrimaryCopy(r.Context(), call.Repo)
		if err == nil {
			switch call.Action {
			case "sync":
				var res mirror.SyncResult
				res, err = sync(r.Context(), rp)
				a.Sync = &res
			case "push":
				if call.Delivery == nil || mirror.TargetRepo(call.Delivery.Target) != call.Repo {
					http.Error(w, "push: a delivery of the repository's", http.StatusBadRequest)
					return
				}
				res := push(r.Context(), *call.Delivery)
				err, a.Permanent = res.Err, res.Permanent
			case "state":
				var st mirror.State
				st, err = mirror.ReadState(rp)
				a.State = &st
			default:
				http.Error(w, "unknown action", http.StatusBadRequest)
				return
			}
		}
		if err != nil {
			a.Error = err.Error()
			a.Elsewhere = errors.Is(err, mirror.ErrElsewhere)
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(a)
	})
}

// importSource is the primary's import of a repository placed with a
// source: a read-only pull mirror with its upstream's credentials when
// its settings say so, a plain copy otherwise (with the source's
// credentials, if the settings hold some, dropped once used).
func (rt *Router) importSource(ctx context.Context, name, source string) error {
	st, err := cluster.RepoSettings(ctx, rt.Node.DB, name)
	if err != nil {
		return err
	}
	var spec mirror.Spec
	if st.Mirror != nil {
		if spec, err = mirror.ParseSpec(*st.Mirror); err != nil {
			return err
		}
	}
	if spec.Pull == nil && spec.Source != nil {
		// A one-off import with credentials: used once, then dropped (also
		// when an earlier attempt imported it but could not drop them).
		_, _, err := mirror.Import(ctx, rt.Repos, name, source, mirror.ImportOptions{Credentials: *spec.Source})
		if err != nil && !errors.Is(err, repo.ErrExists) {
			return err
		}
		spec.Source = nil
		text := spec.Encode()
		_, err = cluster.SetSettings(ctx, rt.Node.DB, name, cluster.Change{Mirror: &text})
		return err
	}
	if spec.Pull == nil {
		_, err = rt.Repos.Import(ctx, name, source)
		return err
	}
	interval, _ := time.ParseDuration(spec.Pull.Interval)
	_, _, err = mirror.Import(ctx, rt.Repos, name, spec.Pull.URL, mirror.ImportOptions{Mirror: true, Interval: interval, Credentials: spec.Pull.Credentials})
	return err
}
