package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"packwire/internal/datadir"
	"packwire/internal/handover"
)

// cmdUpgrade asks the running server to hand over to a new process of
// the binary now at its path, and reports how it went.
func cmdUpgrade(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "upgrade [--data DIR] [--timeout D]"
	fs := newFlagSet("upgrade", syn, `Restart the server of DATA without refusing or cutting a connection: it
starts the binary now at its path (a new version, or the same one) on the
same listening sockets, and once that one serves it stops accepting and
finishes its running requests (within its --grace) before it exits. Sends
SIGUSR2 to the pid in DATA/run/packwire.pid; kill -HUP does the same when
the binary was replaced or a setting changed that needs a new process (see
docs/restarts.md). If the new process fails to start, the old one keeps
serving and says why in its log.`, stderr)
	dir := fs.String("data", datadir.Dir(), "data directory of the server; $PACKWIRE_DATA sets the default")
	timeout := fs.Duration("timeout", 3*time.Minute, "give up waiting for the new process to serve and the old one to exit after this long")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(args, pos, 0, 0, syn); err != nil {
		return err
	}
	if ok, err := datadir.Exists(*dir); err != nil {
		return err
	} else if !ok {
		abs, _ := filepath.Abs(*dir)
		return &datadir.NoDataError{Dir: abs}
	}
	pidFile := handover.PIDFile(*dir)
	old, err := handover.ReadPID(pidFile)
	if err != nil {
		return fmt.Errorf("no server found for %s: %w", *dir, err)
	}
	if err := handover.Signal(old, handover.UpgradeSignal); err != nil {
		return fmt.Errorf("signalling pid %d (from %s): %w", old, pidFile, err)
	}
	deadline := time.Now().Add(*timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	newPID := 0
	for newPID == 0 {
		if pid, err := handover.ReadPID(pidFile); err == nil && pid != old {
			newPID = pid
			break
		}
		if !handover.Alive(old) {
			return fmt.Errorf("pid %d exited without a new process serving: see its log", old)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no new process served within %s; pid %d still serves (its log says why)", *timeout, old)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	fmt.Fprintf(stdout, "upgraded: pid %d serves; pid %d is finishing its running requests\n", newPID, old)
	for handover.Alive(old) {
		if time.Now().After(deadline) {
			return fmt.Errorf("pid %d has not exited within %s", old, *timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	fmt.Fprintf(stdout, "pid %d finished and exited\n", old)
	return nil
}
