// Package webhook turns outbox events into JSON payloads for the webhooks
// whose repository pattern and events match, signs them (HMAC-SHA256 of
// the raw body with the hook's secret, as GitHub's X-Hub-Signature-256)
// and POSTs them: the Sender of the outbox's "webhook" deliveries.
package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"packwire/internal/access"
	"packwire/internal/outbox"
	"packwire/internal/store"
)

// Events a hook may subscribe to.
const (
	// EventPush: refs were created or updated. A push that also deleted
	// refs sends those in a ref-delete payload of their own.
	EventPush = "push"
	// EventRefDelete: refs were deleted.
	EventRefDelete = "ref-delete"
	// EventRepoCreate: packwire repo create or repo import made a repository.
	EventRepoCreate = "repo-create"
)

// AllEvents are every event, the default subscription.
var AllEvents = []string{EventPush, EventRefDelete, EventRepoCreate}

// Headers of a delivery.
const (
	HeaderEvent     = "X-Packwire-Event"
	HeaderDelivery  = "X-Packwire-Delivery" // the same on every attempt: receivers may drop repeats
	HeaderSignature = "X-Packwire-Signature-256"
)

// Payload is the JSON body of a delivery.
type Payload struct {
	Event      string    `json:"event"`
	Repository string    `json:"repository"`
	Pusher     string    `json:"pusher,omitempty"` // push, ref-delete: the user, "anonymous", or "" for a mirror's sync
	Transport  string    `json:"transport,omitempty"`
	Time       time.Time `json:"time"`
	Refs       []Ref     `json:"refs,omitempty"`
	Source     string    `json:"source,omitempty"` // repo-create by import: where from, without credentials
	Mirror     bool      `json:"mirror,omitempty"` // repo-create: a read-only pull mirror
}

// Ref is one ref a push wrote.
type Ref struct {
	Name    string `json:"name"`
	Old     string `json:"old"`
	New     string `json:"new"`
	Created bool   `json:"created,omitempty"`
	Deleted bool   `json:"deleted,omitempty"`
}

// ParseEvents reads a comma-separated event list ("" is every event).
func ParseEvents(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return slices.Clone(AllEvents), nil
	}
	var out []string
	for _, e := range strings.Split(s, ",") {
		e = strings.TrimSpace(e)
		if !slices.Contains(AllEvents, e) {
			return nil, fmt.Errorf("unknown event %q (events: %s)", e, strings.Join(AllEvents, ", "))
		}
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	return out, nil
}

// CheckURL accepts http and https URLs with a host. packwire will POST to
// whatever host is named, internal addresses included: hooks are added by
// admins only.
func CheckURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("not a URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("scheme %q refused: webhooks are http:// or https://", u.Scheme)
	}
	if u.Host == "" {
		return errors.New("the URL names no host")
	}
	return nil
}

// Sign is the signature header's value for body: "sha256=" and the hex
// HMAC-SHA256 of the raw body keyed with the secret.
func Sign(secret string, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// Verify reports whether signature (the header's value) signs body with
// secret, in constant time: what a receiver does.
func Verify(secret string, body []byte, signature string) bool {
	return hmac.Equal([]byte(Sign(secret, body)), []byte(signature))
}

// Payloads are the payloads an event makes, by event name: a push that
// wrote and deleted refs makes a push payload with the written ones and a
// ref-delete payload with the deleted ones, so that each ref is in exactly
// one payload and a hook subscribed to one event gets all of its refs.
func Payloads(ev outbox.Event) map[string]Payload {
	out := map[string]Payload{}
	base := Payload{Repository: ev.Repo, Time: ev.Time.UTC()}
	switch ev.Type {
	case outbox.RepoCreated:
		p := base
		p.Event, p.Source, p.Mirror = EventRepoCreate, ev.Source, ev.Mirror
		out[EventRepoCreate] = p
	case outbox.RefsChanged:
		base.Pusher, base.Transport = ev.User, ev.Transport
		if ev.User == "" && ev.Transport != "mirror" {
			base.Pusher = "anonymous"
		}
		for _, u := range ev.Refs {
			event := EventPush
			if u.Deleted() {
				event = EventRefDelete
			}
			p, ok := out[event]
			if !ok {
				p = base
				p.Event = event
			}
			p.Refs = append(p.Refs, Ref{Name: u.Ref, Old: u.Old, New: u.New, Created: u.Created(), Deleted: u.Deleted()})
			out[event] = p
		}
	}
	return out
}

// Source returns the outbox source of webhook deliveries: one per hook
// whose pattern matches the repository and per payload it subscribed to.
func Source(st *store.Store) outbox.Source {
	return func(ctx context.Context, ev outbox.Event) ([]store.NewDelivery, error) {
		hooks, err := st.Hooks(ctx)
		if err != nil || len(hooks) == 0 {
			return nil, err
		}
		var payloads map[string]Payload
		bodies := map[string][]byte{}
		var ds []store.NewDelivery
		for _, h := range hooks {
			if !access.Match(h.RepoPattern, ev.Repo) {
				continue
			}
			if payloads == nil {
				payloads = Payloads(ev)
			}
			for _, event := range AllEvents { // a fixed order: push before ref-delete
				p, ok := payloads[event]
				if !ok || !slices.Contains(h.Events, event) {
					continue
				}
				body, ok := bodies[event]
				if !ok {
					if body, err = json.Marshal(p); err != nil {
						return nil, err
					}
					bodies[event] = body
				}
				ds = append(ds, store.NewDelivery{Kind: store.KindWebhook, Target: strconv.FormatInt(h.ID, 10), Repo: ev.Repo, Event: event, Payload: body})
			}
		}
		return ds, nil
	}
}

// Sender POSTs webhook deliveries.
type Sender struct {
	Store *store.Store
	// Client sends the requests; nil: one that follows no redirect (a
	// redirect answer is a failed attempt, so a hook cannot be bent to
	// another host).
	Client *http.Client
	// UserAgent names the sender ("packwire-hookshot/VERSION").
	UserAgent string
}

// maxAnswer bounds what is read of a receiver's answer (then dropped).
const maxAnswer = 64 << 10

// NewClient is the client Sender uses by default.
func NewClient() *http.Client {
	return &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// Send makes one attempt: the hook's current URL and secret, a 2xx answer
// is success.
func (s *Sender) Send(ctx context.Context, d store.Delivery) outbox.Result {
	id, err := strconv.ParseInt(d.Target, 10, 64)
	if err != nil {
		return outbox.Result{Err: fmt.Errorf("bad webhook target %q", d.Target), Permanent: true}
	}
	h, err := s.Store.GetHook(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return outbox.Result{Err: errors.New("hook removed"), Permanent: true}
	}
	if err != nil {
		return outbox.Result{Err: err}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.URL, bytes.NewReader(d.Payload))
	if err != nil {
		return outbox.Result{Err: errors.New("bad URL"), Permanent: true}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderEvent, d.Event)
	req.Header.Set(HeaderDelivery, d.GUID)
	ua := s.UserAgent
	if ua == "" {
		ua = "packwire-hookshot"
	}
	req.Header.Set("User-Agent", ua)
	if h.Secret != "" {
		req.Header.Set(HeaderSignature, Sign(h.Secret, d.Payload))
	}
	client := s.Client
	if client == nil {
		client = NewClient()
	}
	resp, err := client.Do(req)
	if err != nil {
		// url.Error spells the URL, which may carry credentials: only the cause.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return outbox.Result{Err: err}
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, maxAnswer))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		msg := "HTTP " + resp.Status
		if resp.StatusCode >= 300 && resp.StatusCode < 400 {
			msg += " (redirects are not followed)"
		}
		return outbox.Result{Status: resp.StatusCode, Err: errors.New(msg)}
	}
	return outbox.Result{Status: resp.StatusCode}
}

// RedactURL is a URL fit to print: no user, password or query.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	hadUser := u.User != nil
	u.User = nil
	if u.RawQuery != "" {
		u.RawQuery = "***"
	}
	u.Fragment = ""
	if hadUser {
		// Written in, not as url.User("***"), which would print %2A%2A%2A.
		return strings.Replace(u.String(), "//", "//***@", 1)
	}
	return u.String()
}
