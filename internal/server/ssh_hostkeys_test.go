package server

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"packwire/internal/gittest"
)

// TestSSHHostKeys: the server offers ed25519, ECDSA and RSA host keys
// (ssh-keyscan finds all three); OpenSSH forced to each host key algorithm
// clones with strict host key checking; ssh-rsa (SHA-1) is not offered; and
// a restart on the same data directory offers the same keys.
func TestSSHHostKeys(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"ssh", "ssh-keyscan"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (scripts/install-deps installs the OpenSSH client)", tool)
		}
	}
	env := gittest.New(t)
	key := env.NewSSHKey("id_hostkeys") // unregistered: anonymous read
	dataDir := filepath.Join(t.TempDir(), "data")
	start := func() (*Server, string) {
		cfg := Defaults
		cfg.DataDir = dataDir
		cfg.GitAddr, cfg.HTTPAddr, cfg.SSHAddr = "", "", "127.0.0.1:0"
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
		cfg.MaintainInterval = 0
		srv, err := New(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		_, port, _ := net.SplitHostPort(srv.SSHAddr.String())
		return srv, port
	}
	stop := func(srv *Server) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	}
	// known_hosts names the server by an alias, so that it still applies
	// after the restart on another port.
	knownHosts := filepath.Join(env.Home, "known_hosts")
	const alias = "packwire-test"
	clone := func(port, hostKeyAlgorithm string) (string, error) {
		ssh := strings.Join([]string{"ssh", "-F", "/dev/null", "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-i", key,
			"-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=" + knownHosts, "-o", "HostKeyAlias=" + alias,
			"-o", "HostKeyAlgorithms=" + hostKeyAlgorithm, "-o", "LogLevel=DEBUG1"}, " ")
		dir := filepath.Join(t.TempDir(), "clone")
		return env.Run("", []string{"GIT_SSH_COMMAND=" + ssh}, "clone", "ssh://git@127.0.0.1:"+port+"/team/app", dir)
	}
	checkClones := func(port string) {
		t.Helper()
		for _, algorithm := range []string{"ssh-ed25519", "ecdsa-sha2-nistp256", "rsa-sha2-512", "rsa-sha2-256"} {
			out, err := clone(port, algorithm)
			if err != nil {
				t.Fatalf("clone with HostKeyAlgorithms=%s: %v\n%s", algorithm, err, out)
			}
			if !strings.Contains(out, "kex: host key algorithm: "+algorithm) {
				t.Fatalf("clone with HostKeyAlgorithms=%s negotiated another:\n%s", algorithm, out)
			}
		}
		out, err := clone(port, "ssh-rsa")
		if err == nil || !strings.Contains(out, "no matching host key type found") {
			t.Fatalf("ssh-rsa (SHA-1 signatures) offered: %v\n%s", err, out)
		}
	}

	srv, port := start()
	r, err := srv.Data.Repos.Create(context.Background(), "team/app")
	if err != nil {
		t.Fatal(err)
	}
	env.Build(r.Path, gittest.Shape{Commits: 2})
	var want []string
	for _, k := range srv.HostKeys {
		want = append(want, k.PublicKey().Type()+" "+gossh.FingerprintSHA256(k.PublicKey()))
	}
	if got := srv.HostKey.PublicKey().Type() + " " + srv.HostKeyFingerprint(); got != want[0] || !strings.HasPrefix(got, "ssh-ed25519 ") {
		t.Fatalf("HostKeyFingerprint gives %q, want the ed25519 key %q", got, want[0])
	}
	scanned, lines := keyscan(t, port)
	if len(scanned) != 3 {
		t.Fatalf("ssh-keyscan -t rsa,ecdsa,ed25519 found %v, want all three", scanned)
	}
	if !slices.Equal(scanned, want) {
		t.Fatalf("ssh-keyscan found %v, want %v", scanned, want)
	}
	var known strings.Builder
	for _, line := range lines {
		known.WriteString(alias + " " + line + "\n")
	}
	if err := os.WriteFile(knownHosts, []byte(known.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	checkClones(port)
	stop(srv)

	srv, port = start()
	defer stop(srv)
	if scanned, _ := keyscan(t, port); !slices.Equal(scanned, want) {
		t.Fatalf("after a restart ssh-keyscan found %v, want %v", scanned, want)
	}
	checkClones(port)
}

// keyscan runs ssh-keyscan for every key type and returns "TYPE SHA256:..."
// per key, in the server's order (ed25519, ECDSA, RSA), and each key as
// "TYPE BASE64" for known_hosts.
func keyscan(t *testing.T, port string) (fingerprints, keys []string) {
	t.Helper()
	out, err := exec.Command("ssh-keyscan", "-t", "rsa,ecdsa,ed25519", "-p", port, "127.0.0.1").Output()
	if err != nil {
		t.Fatalf("ssh-keyscan: %v", err)
	}
	byType := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "[127.0.0.1]:"+port {
			t.Fatalf("ssh-keyscan line %q", line)
		}
		pub, _, _, _, err := gossh.ParseAuthorizedKey([]byte(f[1] + " " + f[2]))
		if err != nil {
			t.Fatalf("ssh-keyscan line %q: %v", line, err)
		}
		byType[pub.Type()] = pub.Type() + " " + gossh.FingerprintSHA256(pub)
		keys = append(keys, f[1]+" "+f[2])
	}
	for _, typ := range []string{gossh.KeyAlgoED25519, gossh.KeyAlgoECDSA256, gossh.KeyAlgoRSA} {
		if fp, ok := byType[typ]; ok {
			fingerprints = append(fingerprints, fp)
		}
	}
	return fingerprints, keys
}
