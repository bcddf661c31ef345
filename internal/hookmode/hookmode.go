// Package hookmode runs this binary as one of the hooks git calls back
// into packwire: upload-pack's pack-objects hook (internal/packcache) and
// receive-pack's proc-receive hook (internal/pushguard) and, on a cluster's
// primary, its reference-transaction hook (internal/server/cluster). git starts the
// hook with the environment packwire gave it, so the choice is made from
// PACKWIRE_HOOK as the process starts, in init: any binary that links the
// pipeline (packwire itself, and every test binary that starts a server)
// is then a working hook, and the hook's start-up does nothing else.
package hookmode

import (
	"os"
	"path/filepath"

	"packwire/internal/lfs"
	"packwire/internal/packcache"
	"packwire/internal/pushguard"
	"packwire/internal/server/cluster"
)

// Env names the hook the binary is started as; PackObjects and
// ProcReceive are its values.
const (
	Env                  = "PACKWIRE_HOOK"
	PackObjects          = "pack-objects"
	ProcReceive          = "proc-receive"
	ReferenceTransaction = "reference-transaction"
	PreReceive           = lfs.HookName // the LFS push check
)

func init() {
	hook := os.Getenv(Env)
	if hook == "" {
		return
	}
	// receive-pack's hooks are found by name in core.hooksPath (links to
	// this binary), and one push may run both: the name tells which.
	switch filepath.Base(os.Args[0]) {
	case ProcReceive, ReferenceTransaction, PreReceive:
		hook = filepath.Base(os.Args[0])
	}
	switch hook {
	case PackObjects:
		os.Exit(packcache.RunHook(os.Args[1:]))
	case ProcReceive:
		os.Exit(pushguard.RunHook(os.Stdin, os.Stdout, os.Stderr))
	case ReferenceTransaction:
		os.Exit(cluster.RunHook(os.Args[1:], os.Stdin, os.Stderr))
	case PreReceive:
		os.Exit(lfs.RunHook(os.Stdin, os.Stderr))
	}
}
