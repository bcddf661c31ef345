package cluster

import (
	"encoding/base64"
	"io"
	"strings"
	"time"

	"packwire/internal/access"
	"packwire/internal/server/cluster/hookwire"
)

// LocalRefs is the namespace of refs each node keeps for itself
// (maintenance's; hidden from clients): never replicated or pruned.
const LocalRefs = hookwire.LocalRefs

// HookName is the reference-transaction hook's file name.
const HookName = "reference-transaction"

// The hook's side: see package hookwire.
const (
	EnvRepo   = hookwire.EnvRepo
	EnvSocket = hookwire.EnvSocket
	EnvToken  = hookwire.EnvToken
	EnvPush   = hookwire.EnvPush
)

// ReplicateTimeout bounds one replica's write of one push.
const ReplicateTimeout = 2 * time.Minute

type (
	Update      = hookwire.Update
	HookRequest = hookwire.Request
	HookAnswer  = hookwire.Answer
)

// RunHook is the reference-transaction hook run by this binary (when
// cmd/packwire-hook is not installed next to it): hookwire.Run.
func RunHook(args []string, stdin io.Reader, stderr io.Writer) int {
	return hookwire.Run(args, stdin, stderr)
}

// RepoURL is a repository on a node's HTTP listener.
func RepoURL(nodeURL, repo string) string {
	return strings.TrimRight(nodeURL, "/") + "/" + repo
}

// AuthEnv gives git the cluster user's credentials as an extra header
// through its environment (never its command line, which other users of
// the machine can read).
func AuthEnv(secret string) []string {
	basic := base64.StdEncoding.EncodeToString([]byte(access.ClusterUser + ":" + secret))
	return []string{"GIT_CONFIG_COUNT=2",
		"GIT_CONFIG_KEY_0=http.extraHeader", "GIT_CONFIG_VALUE_0=Authorization: Basic " + basic,
		"GIT_CONFIG_KEY_1=credential.helper", "GIT_CONFIG_VALUE_1=",
		"GIT_TERMINAL_PROMPT=0"}
}

// IsZero tells whether id is git's null object id (a ref that does not
// exist).
func IsZero(id string) bool { return strings.Trim(id, "0") == "" }

// LastLines is the end of git's output, for an error message.
func LastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
