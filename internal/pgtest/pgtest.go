// Package pgtest starts a throwaway PostgreSQL server for tests: initdb in
// a temporary directory, postgres on a free loopback port, stopped and
// removed when the test ends. initdb and postgres refuse to run as root, so
// as root they run as the "postgres" user (Debian's packages create it).
package pgtest

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver
)

// BinDirs are searched for initdb and postgres, after $PACKWIRE_PG_BIN.
var BinDirs = []string{"/usr/lib/postgresql/17/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/15/bin"}

// Server is a running PostgreSQL.
type Server struct {
	// URL reaches the server's "postgres" database as its superuser.
	URL string
	dir string
	cmd *exec.Cmd
	n   int
	mu  sync.Mutex
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
	initdb, postgres := bin("initdb"), bin("postgres")
	if initdb == "" || postgres == "" {
		t.Fatal("PostgreSQL's initdb and postgres not found: run scripts/install-deps (apt-get install postgresql), or set PACKWIRE_PG_BIN to their directory")
	}
	var cred *syscall.Credential
	dir, err := os.MkdirTemp("", "packwire-pgtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root, PostgreSQL needs the postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	data := filepath.Join(dir, "data")
	run := func(name string, args ...string) *exec.Cmd {
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "LC_ALL=C")
		if cred != nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		}
		return cmd
	}
	if out, err := run(initdb, "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	port := freePort(t)
	var log bytes.Buffer
	cmd := run(postgres, "-D", data, "-p", strconv.Itoa(port), "-h", "127.0.0.1", "-k", dir,
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off", "-c", "max_connections=200")
	cmd.Stdout, cmd.Stderr = &log, &log
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("postgres: %v", err)
	}
	s := &Server{URL: fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port), dir: dir, cmd: cmd}
	t.Cleanup(s.stop)
	deadline := time.Now().Add(30 * time.Second)
	for {
		db, err := sql.Open("pgx", s.URL)
		if err == nil {
			err = db.Ping()
			db.Close()
		}
		if err == nil {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("postgres did not start: %v\n%s", err, log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop asks postgres for a fast shutdown and waits for it.
func (s *Server) stop() {
	s.cmd.Process.Signal(syscall.SIGINT)
	done := make(chan struct{})
	go func() { s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// NewDatabase creates an empty database on the server and returns its
// URL, so that tests sharing a server do not see each other's tables.
func (s *Server) NewDatabase(t testing.TB) string {
	t.Helper()
	s.mu.Lock()
	s.n++
	name := fmt.Sprintf("t%d_%d", os.Getpid(), s.n)
	s.mu.Unlock()
	db, err := sql.Open("pgx", s.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	return strings.Replace(s.URL, "/postgres?", "/"+name+"?", 1)
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
