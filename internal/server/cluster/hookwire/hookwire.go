// Package hookwire is the reference-transaction hook of pushes on a
// cluster's primary and what it says to the server that started the push
// (over the server's unix socket). It imports only the standard library,
// so that cmd/packwire-hook, which is nothing else, starts fast.
package hookwire

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// LocalRefs is the namespace of refs each node keeps for itself
// (maintenance's; hidden from clients): never replicated.
const LocalRefs = "refs/packwire/"

// The primary's receive-pack runs the reference-transaction hook (this
// binary) with these in its environment.
const (
	EnvRepo   = "PACKWIRE_CLUSTER_REPO"
	EnvSocket = "PACKWIRE_CLUSTER_SOCKET" // the server's unix socket for its hooks
	EnvToken  = "PACKWIRE_CLUSTER_TOKEN"  // proves the hook was started by that server's push
	EnvPush   = "PACKWIRE_CLUSTER_PUSH"   // names the push, when the server gave it a hooks directory of its own
)

// replicateTimeout is cluster.ReplicateTimeout (this package imports
// nothing of packwire's, to start fast).
const replicateTimeout = 2 * time.Minute

// Update is one ref update of a push: the hook's input line
// "<old> <new> <ref>".
type Update struct{ Old, New, Ref string }

// Request is what the hook sends the server over its socket: one JSON
// document per connection, answered by one Answer.
type Request struct {
	Token string `json:"token"`
	State string `json:"state"` // prepared, committed, aborted
	Repo  string `json:"repo"`
	// Txn names the push between its states: receive-pack's process id,
	// the hook's parent in every state.
	Txn string `json:"txn"`
	// Push names the push for the server (EnvPush), if it did.
	Push    string   `json:"push,omitempty"`
	Updates []Update `json:"updates,omitempty"`
}

// Answer is the server's verdict; an empty Error lets git go on.
type Answer struct {
	Error string `json:"error,omitempty"`
}

// hookWait bounds how long the hook waits for the server's verdict: the
// replication's own bound, and some room for the store.
const hookWait = replicateTimeout + 30*time.Second

// RunHook is the reference-transaction hook of a push on the primary. It
// does no work itself: it hands the transaction to the packwire server
// that started the push, over the server's unix socket (EnvSocket, with
// EnvToken), and waits for the verdict. In the "prepared" state (git holds
// the refs' locks, the pushed objects are in the quarantine, nothing is
// committed) the server replicates the update to the other replicas and
// commits the next generation in PostgreSQL once a majority, the primary
// counted, holds it (route.Router.ServeHooks); only then does the hook
// exit 0 and git commit the primary's refs; otherwise git aborts and the
// client is told the push failed. "committed" and "aborted" tell the
// server how the push ended, when git still finds the hook then (a push
// with a hooks directory of its own loses it at "prepared": see
// route/pushdir.go).
//
// It is the whole of cmd/packwire-hook, a small binary that starts in
// about a millisecond, which the server installs as the hook when it finds
// it next to itself; otherwise packwire itself runs it (hookmode), a
// larger process that takes a few milliseconds more to start, once or twice per
// push.
func Run(args []string, stdin io.Reader, stderr io.Writer) int {
	if len(args) < 1 || os.Getenv(EnvRepo) == "" || os.Getenv(EnvSocket) == "" {
		io.Copy(io.Discard, stdin)
		return 0
	}
	req := Request{Token: os.Getenv(EnvToken), State: args[0], Repo: os.Getenv(EnvRepo), Txn: strconv.Itoa(os.Getppid()), Push: os.Getenv(EnvPush)}
	if req.State != "prepared" {
		io.Copy(io.Discard, stdin)
		if err := ask(req); err != nil && req.State == "committed" {
			// git has committed: the push stands; this copy is left marked
			// stale and is caught up (or its primary moved) by the nodes.
			fmt.Fprintf(stderr, "packwire: warning: %v\n", err)
		}
		return 0
	}
	sc := bufio.NewScanner(stdin)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// HEAD is listed when its branch moves: replicas move the branch.
		if len(f) == 3 && strings.HasPrefix(f[2], "refs/") && !strings.HasPrefix(f[2], LocalRefs) {
			req.Updates = append(req.Updates, Update{f[0], f[1], f[2]})
		}
	}
	if err := sc.Err(); err != nil {
		// A part of the updates replicated while git commits them all
		// would leave the copies recorded current without them.
		fmt.Fprintf(stderr, "packwire: reading the ref updates: %v; nothing was written\n", err)
		return 1
	}
	if len(req.Updates) == 0 {
		return 0
	}
	if err := ask(req); err != nil {
		fmt.Fprintf(stderr, "packwire: %v\n", err)
		return 1
	}
	return 0
}

// ask sends req to the server and waits for its verdict.
func ask(req Request) error {
	conn, err := net.DialTimeout("unix", os.Getenv(EnvSocket), 5*time.Second)
	if err != nil {
		return fmt.Errorf("cluster: the server's hook socket: %w; nothing was written", err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(hookWait))
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		return fmt.Errorf("cluster: the server's hook socket: %w", err)
	}
	var ans Answer
	if err := json.NewDecoder(conn).Decode(&ans); err != nil {
		return fmt.Errorf("cluster: no verdict from the server: %w; nothing was written", err)
	}
	if ans.Error != "" {
		return fmt.Errorf("%s", ans.Error)
	}
	return nil
}
