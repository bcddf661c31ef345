package server

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"packwire/internal/gittest"
	"packwire/internal/store"
	"packwire/internal/webhook"
)

// hookReceiver is a real HTTP server on 127.0.0.1 that records what it is
// sent; answer decides each reply (nil: 200).
type hookReceiver struct {
	srv    *http.Server
	ln     net.Listener
	URL    string
	mu     sync.Mutex
	got    []receivedHook
	answer func(n int, r *http.Request) int // n counts requests from 1
}

type receivedHook struct {
	header http.Header
	body   []byte
	at     time.Time
}

// newHookReceiver listens on addr ("127.0.0.1:0" for any port).
func newHookReceiver(t *testing.T, addr string, answer func(int, *http.Request) int) *hookReceiver {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	h := &hookReceiver{ln: ln, URL: "http://" + ln.Addr().String() + "/hook", answer: answer}
	h.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		h.got = append(h.got, receivedHook{header: r.Header.Clone(), body: body, at: time.Now()})
		n := len(h.got)
		h.mu.Unlock()
		status := http.StatusOK
		if h.answer != nil {
			status = h.answer(n, r)
		}
		w.WriteHeader(status)
	})}
	go h.srv.Serve(ln)
	t.Cleanup(h.close)
	return h
}

func (h *hookReceiver) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if h.srv.Shutdown(ctx) != nil {
		h.srv.Close()
	}
}

func (h *hookReceiver) requests() []receivedHook {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]receivedHook(nil), h.got...)
}

// waitFor polls cond until it holds or the time is up.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fastRetries makes deliveries retry within a test's time.
func fastRetries(c *Config) {
	c.DeliveryMinBackoff, c.DeliveryMaxBackoff, c.DeliveryPoll = 100*time.Millisecond, 400*time.Millisecond, 50*time.Millisecond
	c.HookTimeout = 2 * time.Second
}

// distinctDeliveries keeps the first request of each delivery id.
func distinctDeliveries(reqs []receivedHook) []receivedHook {
	seen := map[string]bool{}
	var out []receivedHook
	for _, r := range reqs {
		if id := r.header.Get(webhook.HeaderDelivery); !seen[id] {
			seen[id] = true
			out = append(out, r)
		}
	}
	return out
}

func addHook(t *testing.T, st *store.Store, pattern, url, secret string, events ...string) int64 {
	t.Helper()
	if len(events) == 0 {
		events = webhook.AllEvents
	}
	id, err := st.AddHook(context.Background(), store.Hook{RepoPattern: pattern, URL: url, Secret: secret, Events: events})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestWebhookPayloadAndSignature: a push that updates one branch and
// deletes another sends its matching hooks a push payload and a
// ref-delete payload, each with the refs git wrote (old and new ids as
// git has them), the pusher and transport, the headers, and a signature
// that the HMAC of the raw body reproduces; a hook whose pattern does not
// match, or that did not subscribe to the event, gets nothing.
func TestWebhookPayloadAndSignature(t *testing.T) {
	s := startServer(t, fastRetries)
	recv := newHookReceiver(t, "127.0.0.1:0", nil)
	other := newHookReceiver(t, "127.0.0.1:0", nil)
	const secret = "It's a Secret to Everybody"
	addHook(t, s.Data.Store, "team/*", recv.URL, secret)
	addHook(t, s.Data.Store, "other/**", other.URL, "")
	pushOnly := newHookReceiver(t, "127.0.0.1:0", nil)
	addHook(t, s.Data.Store, "**", pushOnly.URL, "", webhook.EventPush)
	bare := s.seed(t, "team/app")

	w := filepath.Join(t.TempDir(), "w")
	s.env.Git("", "clone", "-q", s.httpURL("team/app"), w)
	oldMain := s.env.RevParse(w, "HEAD")
	oldBranch := strings.TrimSpace(s.env.Git(bare, "rev-parse", "refs/heads/branch0"))
	os.WriteFile(filepath.Join(w, "new.txt"), []byte("new\n"), 0o644)
	s.env.Git(w, "add", ".")
	s.env.Git(w, "commit", "-qm", "new")
	newMain := s.env.RevParse(w, "HEAD")
	s.env.Git(w, "push", "-q", s.pushURL("team/app"), "main", ":branch0")

	waitFor(t, 10*time.Second, "two deliveries", func() bool { return len(distinctDeliveries(recv.requests())) >= 2 })
	// An attempt that timed out on a loaded machine is tried again under
	// the same delivery id (at least once, as documented): count ids.
	got := distinctDeliveries(recv.requests())
	byEvent := map[string]receivedHook{}
	for _, r := range got {
		byEvent[r.header.Get(webhook.HeaderEvent)] = r
	}
	zero := strings.Repeat("0", 40)
	for event, want := range map[string]webhook.Ref{
		webhook.EventPush:      {Name: "refs/heads/main", Old: oldMain, New: newMain},
		webhook.EventRefDelete: {Name: "refs/heads/branch0", Old: oldBranch, New: zero, Deleted: true},
	} {
		r, ok := byEvent[event]
		if !ok {
			t.Fatalf("no %s delivery; got %d requests", event, len(got))
		}
		if ct := r.header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: Content-Type %q", event, ct)
		}
		if r.header.Get(webhook.HeaderDelivery) == "" {
			t.Errorf("%s: no %s header", event, webhook.HeaderDelivery)
		}
		// Recomputed here as a receiver would, not with packwire's code.
		mac := hmac.New(sha256.New, []byte(secret))
		mac.Write(r.body)
		if sig, want := r.header.Get(webhook.HeaderSignature), "sha256="+hex.EncodeToString(mac.Sum(nil)); sig != want {
			t.Errorf("%s: signature %q, the body's HMAC is %q", event, sig, want)
		}
		var p webhook.Payload
		if err := json.Unmarshal(r.body, &p); err != nil {
			t.Fatalf("%s: %v: %s", event, err, r.body)
		}
		if p.Event != event || p.Repository != "team/app" || p.Pusher != "alice" || p.Transport != "http" || time.Since(p.Time) > time.Minute {
			t.Errorf("%s payload: %s", event, r.body)
		}
		if len(p.Refs) != 1 || p.Refs[0] != want {
			t.Errorf("%s refs: %+v, want %+v", event, p.Refs, want)
		}
	}
	if len(got) != 2 {
		t.Errorf("%d deliveries to the team/* hook, want 2", len(got))
	}
	waitFor(t, 10*time.Second, "the push-only hook's delivery", func() bool { return len(pushOnly.requests()) >= 1 })
	time.Sleep(300 * time.Millisecond) // anything more would have come by now
	if only := distinctDeliveries(pushOnly.requests()); len(only) != 1 || only[0].header.Get(webhook.HeaderEvent) != webhook.EventPush {
		t.Errorf("push-only hook got %d deliveries", len(only))
	}
	if n := len(other.requests()); n != 0 {
		t.Errorf("a hook for other/** got %d deliveries", n)
	}
	if pushOnly.requests()[0].header.Get(webhook.HeaderSignature) != "" {
		t.Error("a hook without a secret got a signature")
	}
	ds, err := s.Data.Store.Deliveries(context.Background(), store.DeliveryFilter{Kind: store.KindWebhook})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		if d.State != store.DeliveryDelivered || d.Attempts != 1 || d.LastStatus != 200 || d.LastLatency <= 0 {
			t.Errorf("delivery %d: %+v", d.ID, d)
		}
	}

	// The dashboard's Repos page lists them, URL without the secret.
	ctx := context.Background()
	s.Data.Store.AddUser(ctx, "root")
	s.Data.Store.SetGrant(ctx, store.Grant{User: "root", RepoPattern: "**", Role: "admin"})
	rootToken, err := s.Data.Access.CreateToken(ctx, "root", 0)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", "http://"+s.HTTPAddr.String()+"/-/repos", nil)
	req.SetBasicAuth("root", rootToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	table := string(page)
	if i := strings.Index(table, `id="deliveries-table"`); i >= 0 {
		table = table[i:]
	} else {
		t.Fatalf("no deliveries table on the Repos page:\n%s", page)
	}
	if resp.StatusCode != 200 || strings.Count(table, "<span class=\"ok\">delivered</span>") != 3 || !strings.Contains(table, recv.URL) ||
		!strings.Contains(table, "HTTP 200") || !strings.Contains(table, "ref-delete") || strings.Contains(table, secret) {
		t.Fatalf("Repos page deliveries: HTTP %d\n%s", resp.StatusCode, table)
	}
}

// TestWebhookRetriesUntilReceiverComesBack: a receiver that is down
// (connection refused), then answers 500, then 200 gets the delivery, and
// every attempt is kept with its error or status and latency.
func TestWebhookRetriesUntilReceiverComesBack(t *testing.T) {
	t.Parallel()
	s := startServer(t, fastRetries)
	// A port nobody listens on, for now.
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.Addr().String()
	probe.Close()
	addHook(t, s.Data.Store, "**", "http://"+addr+"/hook", "")
	s.seed(t, "app")
	pushNewCommit(t, s, "app")

	var d store.Delivery
	waitFor(t, 10*time.Second, "two refused attempts", func() bool {
		ds, _ := s.Data.Store.Deliveries(context.Background(), store.DeliveryFilter{Kind: store.KindWebhook})
		if len(ds) == 1 {
			d = ds[0]
		}
		return d.Attempts >= 2
	})
	if d.State != store.DeliveryPending || !strings.Contains(d.LastError, "connection refused") {
		t.Fatalf("while down: %+v", d)
	}
	recv := newHookReceiver(t, addr, func(n int, _ *http.Request) int {
		if n <= 2 {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})
	waitFor(t, 15*time.Second, "the delivery", func() bool {
		d, _ = s.Data.Store.GetDelivery(context.Background(), d.ID)
		return d.State == store.DeliveryDelivered
	})
	if n := len(recv.requests()); n != 3 {
		t.Fatalf("receiver got %d requests, want 3 (500, 500, 200)", n)
	}
	as, err := s.Data.Store.Attempts(context.Background(), d.ID)
	if err != nil {
		t.Fatal(err)
	}
	var statuses []string
	for _, a := range as {
		statuses = append(statuses, strconv.Itoa(a.Status))
		if a.Latency <= 0 {
			t.Errorf("attempt %d without latency", a.Number)
		}
	}
	last := as[len(as)-1]
	if len(as) < 5 || !strings.Contains(as[0].Error, "connection refused") || last.Status != 200 || last.Error != "" ||
		as[len(as)-2].Status != 500 || as[len(as)-3].Status != 500 {
		t.Fatalf("attempts: %+v", as)
	}
	t.Logf("attempt statuses: %s (0: no answer)", strings.Join(statuses, ","))
}

// pushNewCommit pushes one new commit to main over HTTP and returns the
// push's wall time.
func pushNewCommit(t *testing.T, s *testServer, name string) time.Duration {
	t.Helper()
	w := filepath.Join(t.TempDir(), "w")
	if _, err := os.Stat(w); err != nil {
		s.env.Git("", "clone", "-q", s.httpURL(name), w)
	}
	return commitAndPush(t, s.env, w, s.pushURL(name))
}

func commitAndPush(t *testing.T, env *gittest.Env, w, url string) time.Duration {
	t.Helper()
	os.WriteFile(filepath.Join(w, "n.txt"), []byte(time.Now().String()), 0o644)
	env.Git(w, "add", ".")
	env.Git(w, "commit", "-qm", "n")
	start := time.Now()
	env.Git(w, "push", "-q", url, "HEAD:main")
	return time.Since(start)
}

// startAt starts a packwire on an existing data directory (a restart).
func startAt(t *testing.T, dataDir string, logs io.Writer, mutate func(*Config)) *Server {
	t.Helper()
	cfg := Defaults
	cfg.DataDir = dataDir
	cfg.GitAddr, cfg.HTTPAddr, cfg.SSHAddr = "127.0.0.1:0", "127.0.0.1:0", ""
	cfg.Log = slog.New(slog.NewTextHandler(logs, nil))
	cfg.RecordsFlush = 20 * time.Millisecond
	cfg.MaintainInterval = 0
	if mutate != nil {
		mutate(&cfg)
	}
	srv, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	return srv
}

func shutdown(t *testing.T, srv *Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestWebhookPendingSurvivesRestart: what the server had not delivered
// when it stopped is delivered by the next server on the same data
// directory: a delivery waiting for its retry (its receiver was down) once
// the retry is due, and one queued while the delivery loop was not running
// at once.
func TestWebhookPendingSurvivesRestart(t *testing.T) {
	t.Parallel()
	env := gittest.New(t)
	data := filepath.Join(t.TempDir(), "data")
	logs := &logBuffer{}
	retryIn2s := func(c *Config) { c.DeliveryMinBackoff, c.DeliveryPoll = 2*time.Second, 50*time.Millisecond }
	a := startAt(t, data, logs, retryIn2s)
	ctx := context.Background()
	a.Data.Store.AddUser(ctx, "alice")
	a.Data.Store.SetGrant(ctx, store.Grant{User: "alice", RepoPattern: "**", Role: "write"})
	token, err := a.Data.Access.CreateToken(ctx, "alice", 0)
	if err != nil {
		t.Fatal(err)
	}
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.Addr().String()
	probe.Close() // down: connection refused
	addHook(t, a.Data.Store, "**", "http://"+addr+"/hook", "")
	r, err := a.Data.Repos.Create(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	env.Build(r.Path, gittest.Shape{Commits: 3})
	w := filepath.Join(t.TempDir(), "w")
	env.Git("", "clone", "-q", fmt.Sprintf("http://%s/app", a.HTTPAddr), w)
	pushURL := fmt.Sprintf("http://alice:%s@%s/app", token, a.HTTPAddr)
	commitAndPush(t, env, w, pushURL)
	waitFor(t, 10*time.Second, "a failed first attempt", func() bool {
		ds, _ := a.Data.Store.Deliveries(ctx, store.DeliveryFilter{})
		return len(ds) == 1 && ds[0].Attempts == 1
	})
	// The loop stops; a second push is still queued, in its request path.
	a.stopOutgoing()
	commitAndPush(t, env, w, pushURL)
	ds, _ := a.Data.Store.Deliveries(ctx, store.DeliveryFilter{})
	if len(ds) != 2 || ds[0].State != store.DeliveryPending || ds[0].Attempts != 0 || ds[1].State != store.DeliveryPending {
		t.Fatalf("before the restart: %+v", ds)
	}
	shutdown(t, a)

	recv := newHookReceiver(t, addr, nil)
	b := startAt(t, data, logs, retryIn2s)
	defer shutdown(t, b)
	waitFor(t, 10*time.Second, "both deliveries after the restart", func() bool { return len(recv.requests()) == 2 })
	// The receiver has a request before the server has stored its answer:
	// wait for the store to say both are settled, then check how.
	waitFor(t, 10*time.Second, "both deliveries settled in the store", func() bool {
		ds, _ = b.Data.Store.Deliveries(ctx, store.DeliveryFilter{})
		return len(ds) == 2 && ds[0].State != store.DeliveryPending && ds[1].State != store.DeliveryPending
	})
	if ds[0].State != store.DeliveryDelivered || ds[0].Attempts != 1 || ds[1].State != store.DeliveryDelivered || ds[1].Attempts != 2 {
		t.Fatalf("after the restart: %+v", ds)
	}
	for _, got := range recv.requests() {
		var p webhook.Payload
		if err := json.Unmarshal(got.body, &p); err != nil || p.Repository != "app" || len(p.Refs) != 1 || p.Pusher != "alice" {
			t.Fatalf("payload: %v %s", err, got.body)
		}
	}
}

// TestSlowWebhookDoesNotSlowPushes: pushes never wait for their webhooks.
// The receiver holds every delivery open until the pushes are done: each
// push must still complete (one that waited for its delivery would hang
// for the ten-minute hook timeout), and each hook has one attempt in
// flight at a time while the others queue. Causal, not timed: a loaded
// machine cannot fail it.
func TestSlowWebhookDoesNotSlowPushes(t *testing.T) {
	s := startServer(t, func(c *Config) { c.HookTimeout = 10 * time.Minute })
	release := make(chan struct{})
	var mu sync.Mutex
	inFlight, mostInFlight := 0, 0
	slow := newHookReceiver(t, "127.0.0.1:0", func(_ int, r *http.Request) int {
		mu.Lock()
		inFlight++
		mostInFlight = max(mostInFlight, inFlight)
		mu.Unlock()
		select {
		case <-release:
		case <-r.Context().Done():
		}
		mu.Lock()
		inFlight--
		mu.Unlock()
		return http.StatusOK
	})
	addHook(t, s.Data.Store, "hooked/*", slow.URL, "secret")
	addHook(t, s.Data.Store, "hooked/*", slow.URL, "") // two targets: two attempts may be in flight
	s.seed(t, "hooked/app")
	w := filepath.Join(t.TempDir(), "w")
	s.env.Git("", "clone", "-q", s.httpURL("hooked/app"), w)
	const pushes = 5
	for i := 0; i < pushes; i++ {
		os.WriteFile(filepath.Join(w, "n.txt"), []byte(strconv.Itoa(i)), 0o644)
		s.env.Git(w, "add", ".")
		s.env.Git(w, "commit", "-qm", "n")
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		push := exec.CommandContext(ctx, "git", "push", "-q", s.pushURL("hooked/app"), "HEAD:main")
		push.Dir, push.Env = w, s.env.Vars
		out, err := push.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("push %d while the receiver holds its deliveries: %v\n%s", i+1, err, out)
		}
	}
	waitFor(t, time.Minute, "an attempt of each hook held by the receiver", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return inFlight == 2
	})
	ds, err := s.Data.Store.Deliveries(context.Background(), store.DeliveryFilter{Kind: store.KindWebhook, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 2*pushes {
		t.Fatalf("%d deliveries queued, want %d", len(ds), 2*pushes)
	}
	close(release)
	waitFor(t, time.Minute, "every delivery made once released", func() bool {
		ds, _ := s.Data.Store.Deliveries(context.Background(), store.DeliveryFilter{Kind: store.KindWebhook, Limit: 100})
		for _, d := range ds {
			if d.State != store.DeliveryDelivered {
				return false
			}
		}
		return len(ds) == 2*pushes
	})
	mu.Lock()
	defer mu.Unlock()
	if mostInFlight != 2 {
		t.Fatalf("%d attempts in flight at once, want one per hook (2)", mostInFlight)
	}
}
