package main

import (
	"database/sql"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"packwire/internal/gittest"
	"packwire/internal/pgtest"
)

// testProxy forwards TCP connections to upstream (settable once the
// target runs). cut stops every byte either way (connections stay open,
// new ones are accepted and held), as a network that drops every packet
// does, until mend; cutWhere does the same to the connections it picks
// only (a partition of some clients); onUp, if set, sees each chunk the
// client sends before it is forwarded, onDown each chunk the upstream
// answers.
type testProxy struct {
	ln       net.Listener
	upstream atomic.Value // string
	onUp     atomic.Value // func([]byte)
	onDown   atomic.Value // func([]byte)
	mu       sync.Mutex
	open     chan struct{} // closed while bytes move
	where    func(client net.Conn) bool
	changed  chan struct{} // closed and replaced when where changes
	conns    []net.Conn
}

func newTestProxy(t *testing.T, upstream string) *testProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &testProxy{ln: ln, open: make(chan struct{}), changed: make(chan struct{})}
	close(p.open)
	p.upstream.Store(upstream)
	t.Cleanup(func() {
		ln.Close()
		p.mend()
		p.cutWhere(nil)
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.forward(c)
		}
	}()
	return p
}

func (p *testProxy) addr() string { return p.ln.Addr().String() }

func (p *testProxy) track(c net.Conn) {
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
}

// gate waits while a cut lasts, or one of client's.
func (p *testProxy) gate(client net.Conn) {
	for {
		p.mu.Lock()
		open, where, changed := p.open, p.where, p.changed
		p.mu.Unlock()
		<-open
		if where == nil || !where(client) {
			return
		}
		<-changed
	}
}

// cutWhere holds the bytes of the client connections where picks (nil:
// none), open ones included, until it changes.
func (p *testProxy) cutWhere(where func(client net.Conn) bool) {
	p.mu.Lock()
	p.where = where
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

func (p *testProxy) cut() {
	p.mu.Lock()
	select {
	case <-p.open:
		p.open = make(chan struct{})
	default:
	}
	p.mu.Unlock()
}

func (p *testProxy) mend() {
	p.mu.Lock()
	select {
	case <-p.open:
	default:
		close(p.open)
	}
	p.mu.Unlock()
}

func (p *testProxy) forward(c net.Conn) {
	p.track(c)
	p.gate(c)
	up, err := net.Dial("tcp", p.upstream.Load().(string))
	if err != nil {
		c.Close()
		return
	}
	p.track(up)
	pipe := func(dst, src net.Conn, watch *atomic.Value) {
		defer dst.Close()
		defer src.Close()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if f, _ := watch.Load().(func([]byte)); f != nil {
					f(buf[:n])
				}
				p.gate(c)
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	go pipe(up, c, &p.onUp)
	pipe(c, up, &p.onDown)
}

// proxiedNodes starts nodes a, b and c on the cluster database url, each
// reached by its peers through a testProxy of its own (its --node-url), so
// a test can watch or cut what the others send it. The nodes' logs are
// printed if the test fails.
func proxiedNodes(t *testing.T, base, url string) (map[string]*nodeProc, map[string]*testProxy) {
	t.Helper()
	nodes := map[string]*nodeProc{}
	proxies := map[string]*testProxy{}
	names := []string{"a", "b", "c"}
	for _, name := range names {
		proxies[name] = newTestProxy(t, "")
		nodes[name] = startNode(t, name, filepath.Join(base, name), url, "--node-url", "http://"+proxies[name].addr())
		proxies[name].upstream.Store(nodes[name].httpAddr)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range names {
				b, _ := os.ReadFile(filepath.Join(base, name+".log"))
				t.Logf("node %s's log:\n%s", name, lastLines(string(b)))
			}
		}
	})
	return nodes, proxies
}

// appPlacement reads team/app's placement from the cluster database:
// placement is its primary, generation and the copies current at it;
// settled waits (within, a safety net) until all three copies are at gen
// and returns the primary.
func appPlacement(t *testing.T, url string, within time.Duration) (placement func() (string, int64, int), settled func(gen int64) string) {
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	placement = func() (primary string, gen int64, current int) {
		db.QueryRow("SELECT primary_node, generation FROM cluster_repos WHERE name = 'team/app'").Scan(&primary, &gen)
		db.QueryRow("SELECT count(*) FROM replicas WHERE repo = 'team/app' AND generation = $1", gen).Scan(&current)
		return
	}
	settled = func(gen int64) string {
		t.Helper()
		for deadline := time.Now().Add(within); ; time.Sleep(50 * time.Millisecond) {
			p, g, n := placement()
			if g == gen && n == 3 {
				return p
			}
			if time.Now().After(deadline) {
				t.Fatalf("the cluster did not settle at generation %d: primary %s, generation %d, %d copies current", gen, p, g, n)
			}
		}
	}
	return placement, settled
}

// appCluster is three proxied nodes on a fresh database holding team/app
// with three replicas, alice allowed to push, and a work tree to push
// from: the start the pause and partition tests share.
type appCluster struct {
	url, base string
	nodes     map[string]*nodeProc
	proxies   map[string]*testProxy
	placement func() (string, int64, int)
	settled   func(gen int64) string
	admin     func(args ...string) string
	first     string // team/app's primary once placed
	env       *gittest.Env
	work      string
	pushTo    func(node string) (string, error) // HEAD to main through node, over HTTP
}

func startAppCluster(t *testing.T, within time.Duration) *appCluster {
	t.Helper()
	c := &appCluster{url: pgtest.Shared(t).NewDatabase(t), base: t.TempDir()}
	c.nodes, c.proxies = proxiedNodes(t, c.base, c.url)
	c.placement, c.settled = appPlacement(t, c.url, within)
	c.admin = storeAdmin(t, c.url, filepath.Join(c.base, "none"))
	c.admin("repo", "create", "team/app", "--replicas", "3")
	token := aliceWrites(c.admin)
	c.first = c.settled(0)
	c.env = gittest.New(t)
	c.work = filepath.Join(c.base, "work")
	c.env.Git("", "init", "-q", "-b", "main", c.work)
	c.pushTo = func(node string) (string, error) {
		return c.env.Run(c.work, nil, "push", "--porcelain", fmt.Sprintf("http://alice:%s@%s/team/app", token, c.nodes[node].httpAddr), "HEAD:refs/heads/main")
	}
	return c
}
