package lfs

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"packwire/internal/access"
	"packwire/internal/governor"
	"packwire/internal/repo"
)

// AuthenticateTTL is how long the token git-lfs-authenticate hands out
// is good for; git-lfs asks again once expires_in has passed.
const AuthenticateTTL = 15 * time.Minute

// IsSSHCommand reports whether an SSH exec command is Git LFS's.
func (s *Service) IsSSHCommand(command string) bool {
	return strings.HasPrefix(command, "git-lfs-authenticate ") || strings.HasPrefix(command, "git-lfs-transfer ")
}

// parseSSHCommand splits "git-lfs-authenticate 'NAME' OP" (the path bare
// or single-quoted, as git-lfs sends it) into its three words.
func parseSSHCommand(command string) (name, path, op string, ok bool) {
	f := strings.Fields(command)
	if len(f) != 3 || len(command) > 4096 {
		return "", "", "", false
	}
	path = f[1]
	if len(path) >= 2 && path[0] == '\'' && path[len(path)-1] == '\'' {
		path = path[1 : len(path)-1]
	}
	if strings.ContainsAny(path, "'\\") || path == "" {
		return "", "", "", false
	}
	return f[0], path, f[2], true
}

// ServeSSH runs git-lfs-authenticate: it answers the LFS API's href for
// the repository and, for a user, an Authorization header with a token
// good for AuthenticateTTL, so that git-lfs over SSH needs no HTTP
// credentials; and git-lfs-transfer, the pure SSH protocol (transfer.go).
func (s *Service) ServeSSH(ctx context.Context, p access.Principal, remote, command string, stdin io.Reader, stdout, stderr io.Writer) uint32 {
	start := time.Now()
	name, path, op, ok := parseSSHCommand(command)
	if ok && name == "git-lfs-transfer" && op == "lock" {
		// Locks over the SSH protocol are not spoken: git-lfs then uses
		// git-lfs-authenticate and the HTTP locks API.
		fmt.Fprintf(stderr, "fatal: git-lfs-transfer: the lock operation is not supported; use git-lfs-authenticate\n")
		return 128
	}
	if !ok || op != "download" && op != "upload" {
		fmt.Fprintf(stderr, "fatal: invalid command: %s NAME download|upload\n", strings.Fields(command)[0])
		return 128
	}
	n := needRead
	if op == "upload" {
		n = needWrite
	}
	r, aerr := s.authorize(ctx, p, path, n, false)
	if aerr != nil {
		s.record("lfs-authenticate", "ssh", repo.Repo{}, p, remote, start, 0, 0, governor.ResultRefused, aerr.Message)
		fmt.Fprintf(stderr, "fatal: %s\n", aerr.Message)
		return 128
	}
	if name == "git-lfs-transfer" {
		return s.transfer(ctx, p, remote, r, op, stdin, stdout)
	}
	answer := struct {
		Href      string            `json:"href"`
		Header    map[string]string `json:"header,omitempty"`
		ExpiresIn int               `json:"expires_in,omitempty"`
	}{Href: strings.TrimSuffix(s.HTTPURL, "/") + "/" + r.Name + ".git" + strings.TrimSuffix(Prefix, "/")}
	if !p.IsAnonymous() {
		token, err := s.Access.CreateToken(ctx, p.User, AuthenticateTTL)
		if err != nil {
			fmt.Fprintf(stderr, "fatal: temporarily unavailable: the store did not answer, retry shortly\n")
			return 128
		}
		answer.Header = map[string]string{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte(p.User+":"+token))}
		// A little short of the token's life: git-lfs renews before it ends.
		answer.ExpiresIn = int((AuthenticateTTL - time.Minute) / time.Second)
	}
	if err := json.NewEncoder(stdout).Encode(answer); err != nil {
		return 1
	}
	return 0
}
