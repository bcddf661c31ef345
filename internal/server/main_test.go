package server

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"packwire/internal/s3test"
)

// envServe, set to a data directory, makes this test binary a packwire
// server (TestMain) for tests that need one in another process, e.g. under
// a lower descriptor limit. It prints "git=ADDR http=ADDR ssh=ADDR" once
// listening, logs to stderr and shuts down on SIGTERM.
const envServe = "PACKWIRE_TEST_SERVE"

// Most tests here run in parallel (t.Parallel): each has its own server on
// 127.0.0.1:0 and its own directories. A test counts its own server's git
// children only (s.children: those naming its data directory), so counting
// them needs no test to itself. Those that count process-wide things
// (goroutines, descriptors, the heap) or assert a tight wall time or a
// short timeout stay sequential; Go runs them before the parallel ones,
// never beside them (docs/testing.md).

// TestMain removes the shared template repository after the tests, and
// serves in a subprocess (envServe). (This binary serves as git's hooks
// through internal/hookmode, as packwire does.)
func TestMain(m *testing.M) {
	if dir := os.Getenv(envServe); dir != "" {
		os.Exit(serveForTest(dir))
	}
	code := s3test.Main(m) // stops the shared weed, if a test started it
	if bigTemplate != "" {
		os.RemoveAll(filepath.Dir(bigTemplate))
	}
	os.Exit(code)
}

func serveForTest(dataDir string) int {
	sigCtx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg := Defaults
	cfg.DataDir = dataDir
	cfg.GitAddr, cfg.HTTPAddr, cfg.SSHAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.MaintainInterval = 0
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	srv, err := New(context.Background(), cfg)
	if err == nil {
		err = srv.Start()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		return 1
	}
	fmt.Printf("git=%s http=%s ssh=%s\n", srv.GitAddr, srv.HTTPAddr, srv.SSHAddr)
	<-sigCtx.Done()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "shutdown:", err)
	}
	return 0
}
