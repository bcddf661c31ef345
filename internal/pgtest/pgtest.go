// Package pgtest starts a throwaway PostgreSQL server for tests: initdb in
// a temporary directory, postgres on a free loopback port, stopped and
// removed when the test ends. initdb and postgres refuse to run as root, so
// as root they run as the "postgres" user (Debian's packages create it).
package pgtest

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"packwire/internal/needs"
)

// BinDirs are searched for initdb and postgres, after $PACKWIRE_PG_BIN.
var BinDirs = []string{"/usr/lib/postgresql/17/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/15/bin"}

// ErrNotInstalled says how to get PostgreSQL's programs.
var ErrNotInstalled = errors.New("PostgreSQL's initdb and postgres not found: run scripts/install-deps (apt-get install postgresql), or set PACKWIRE_PG_BIN to their directory")

// Server is a running PostgreSQL.
type Server struct {
	// URL reaches the server's "postgres" database as its superuser.
	URL    string
	dir    string
	cmd    *exec.Cmd
	exited chan struct{}
	port   int
	start  func(port int) *exec.Cmd
	n      int
	mu     sync.Mutex
	shared bool // Shared's: its databases are dropped after their tests
}

// bin finds a PostgreSQL program, or "".
func bin(name string) string {
	dirs := BinDirs
	if d := os.Getenv("PACKWIRE_PG_BIN"); d != "" {
		dirs = append([]string{d}, dirs...)
	}
	for _, d := range dirs {
		if p := filepath.Join(d, name); isExecutable(p) {
			return p
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	return ""
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// Start starts a server for t and its subtests. Without PostgreSQL's
// programs the test fails saying what to install, as a missing git does
// (scripts/install-deps installs it).
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := Launch()
	if errors.Is(err, ErrNotInstalled) {
		needs.Missing(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// shared is the server Shared hands out, one per test binary.
var shared struct {
	once sync.Once
	s    *Server
	err  error
}

// Shared returns a PostgreSQL shared by the tests of this test binary, for
// tests that only need a database of their own (NewDatabase; it is dropped
// at the test's end): one initdb and start per package instead of one per
// test. A test that stops, kills or restarts PostgreSQL starts its own
// (Start). The package's TestMain stops it: os.Exit(pgtest.Main(m)).
func Shared(t testing.TB) *Server {
	t.Helper()
	shared.once.Do(func() {
		shared.s, shared.err = Launch()
		if shared.err == nil {
			shared.s.shared = true
		}
	})
	if errors.Is(shared.err, ErrNotInstalled) {
		needs.Missing(t, "%v", shared.err)
	}
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.s
}

// Main runs the tests, then stops the server Shared started, if any.
func Main(m *testing.M) int {
	code := m.Run()
	if shared.s != nil {
		shared.s.Stop()
	}
	return code
}

// Launch starts a server outside a test (benchmarks); Stop ends it and
// removes its files.
func Launch() (*Server, error) {
	initdb, postgres := bin("initdb"), bin("postgres")
	if initdb == "" || postgres == "" {
		return nil, ErrNotInstalled
	}
	var cred *credential
	dir, err := os.MkdirTemp("", "packwire-pgtest-")
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Server, error) {
		os.RemoveAll(dir)
		return nil, err
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return fail(fmt.Errorf("running as root, PostgreSQL needs the postgres user: %w", err))
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &credential{uid: uint32(uid), gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			return fail(err)
		}
	}
	data := filepath.Join(dir, "data")
	run := func(name string, args ...string) *exec.Cmd {
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "LC_ALL=C")
		runAs(cmd, cred, false)
		return cmd
	}
	if out, err := run(initdb, "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync").CombinedOutput(); err != nil {
		return fail(fmt.Errorf("initdb: %v\n%s", err, out))
	}
	// A port picked free may be taken before postgres binds it: try again.
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			return fail(err)
		}
		s := &Server{URL: fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port), dir: dir, port: port,
			start: func(port int) *exec.Cmd {
				// fsync off (only the machine's crash loses what the page
				// cache holds), but synchronous_commit on, its default: a
				// commit answered is in the WAL the kernel has, so a killed
				// postgres (the nemesis suite's pg-kill) keeps it, as the
				// cluster's promise requires of PostgreSQL. max_connections
				// 1000: the cluster tests that share one (Shared) run in
				// parallel, 4 nodes each with pools of up to 21.
				cmd := run(postgres, "-D", data, "-p", strconv.Itoa(port), "-h", "127.0.0.1", "-k", dir,
					"-c", "fsync=off", "-c", "full_page_writes=off", "-c", "max_connections=1000")
				runAs(cmd, cred, true)
				return cmd
			}}
		if lastErr = s.launch(); lastErr == nil {
			return s, nil
		}
	}
	return fail(fmt.Errorf("postgres did not start: %w", lastErr))
}

// launch starts postgres on s.port and waits until it answers.
func (s *Server) launch() error {
	var log bytes.Buffer
	cmd := s.start(s.port)
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	exited := s.exited
	go func() { cmd.Wait(); close(exited) }()
	if err := s.waitReady(30 * time.Second); err != nil {
		s.stopProcess()
		return fmt.Errorf("%w\n%s", err, log.String())
	}
	return nil
}

// Restart stops postgres (a fast shutdown: connections are cut) and starts
// it again on the same port and data.
func (s *Server) Restart() error {
	s.stopProcess()
	return s.launch()
}

// Halt stops postgres with a fast shutdown and keeps its data; Resume
// starts it again (the chaos suite's "PostgreSQL down").
func (s *Server) Halt() { s.stopProcess() }

// Kill stops postgres and its backends with SIGKILL, as a crash would;
// Resume starts it again (crash recovery).
func (s *Server) Kill() {
	killGroup(s.cmd)
	<-s.exited
}

// Resume starts a halted or killed postgres on the same port and data.
func (s *Server) Resume() error { return s.launch() }

// Port is the loopback port postgres listens on.
func (s *Server) Port() int { return s.port }

func (s *Server) waitReady(within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		select {
		case <-s.exited:
			return errors.New("postgres exited")
		default:
		}
		db, err := sql.Open("pgx", s.URL)
		if err == nil {
			err = db.Ping()
			db.Close()
		}
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop stops the server and removes its files.
func (s *Server) Stop() {
	s.stopProcess()
	os.RemoveAll(s.dir)
}

// stopProcess asks postgres for a fast shutdown and waits for it.
func (s *Server) stopProcess() {
	interrupt(s.cmd)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		killGroup(s.cmd)
		<-s.exited
	}
}

// NewDatabase creates an empty database on the server and returns its
// URL, so that tests sharing a server do not see each other's tables.
func (s *Server) NewDatabase(t testing.TB) string {
	t.Helper()
	name, url, err := s.createDatabase()
	if err != nil {
		t.Fatal(err)
	}
	if s.shared {
		// FORCE ends what connections the test left open, so that they do
		// not add up towards max_connections over the package's tests.
		t.Cleanup(func() {
			if err := s.exec("DROP DATABASE " + name + " WITH (FORCE)"); err != nil {
				t.Logf("pgtest: %v", err)
			}
		})
	}
	return url
}

// CreateDatabase creates an empty database and returns its URL.
func (s *Server) CreateDatabase() (string, error) {
	_, url, err := s.createDatabase()
	return url, err
}

func (s *Server) createDatabase() (name, url string, err error) {
	s.mu.Lock()
	s.n++
	name = fmt.Sprintf("t%d_%d", os.Getpid(), s.n)
	s.mu.Unlock()
	if err := s.exec("CREATE DATABASE " + name); err != nil {
		return "", "", err
	}
	return name, strings.Replace(s.URL, "/postgres?", "/"+name+"?", 1), nil
}

// exec runs one statement as the superuser on the "postgres" database.
func (s *Server) exec(statement string) error {
	db, err := sql.Open("pgx", s.URL)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, statement); err != nil {
		return fmt.Errorf("%s: %w", statement, err)
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
