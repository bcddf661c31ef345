package gittest

import (
	"os/exec"
	"path/filepath"
	"strings"
)

// NewSSHKey makes an ed25519 key pair with ssh-keygen in the client's HOME
// and returns the private key's path (the public key is path + ".pub").
func (e *Env) NewSSHKey(name string) string {
	e.T.Helper()
	if _, err := exec.LookPath("ssh-keygen"); err != nil {
		e.T.Fatal("ssh-keygen is not installed: run scripts/install-deps")
	}
	path := filepath.Join(e.Home, name)
	if out, err := exec.Command("ssh-keygen", "-t", "ed25519", "-N", "", "-f", path, "-q").CombinedOutput(); err != nil {
		e.T.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	return path
}

// SSHOptions are the OpenSSH client options for a test server: no config
// file, no host key checks, only the given key. key "" means no key at all
// (keyboard-interactive, anonymous). logLevel "" is ERROR.
func SSHOptions(key, logLevel string, extra ...string) []string {
	if logLevel == "" {
		logLevel = "ERROR"
	}
	opts := []string{"-F", "/dev/null", "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=no",
		"-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=" + logLevel, "-o", "PasswordAuthentication=no"}
	if key == "" {
		// BatchMode turns keyboard-interactive off, even with no questions.
		opts = append(opts, "-o", "PubkeyAuthentication=no", "-o", "BatchMode=no")
	} else {
		opts = append(opts, "-o", "BatchMode=yes", "-i", key)
	}
	return append(opts, extra...)
}

// SSHCommandEnv is a GIT_SSH_COMMAND=... environment entry using key.
func SSHCommandEnv(key string, extra ...string) string {
	return "GIT_SSH_COMMAND=ssh " + strings.Join(SSHOptions(key, "", extra...), " ")
}
