//go:build unix

package server

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"packwire/internal/gittest"
	"packwire/internal/store"
)

// BenchmarkConnectionCost measures packwire's own CPU (this process's
// rusage, git children apart) per `git ls-remote`, one connection each,
// over git:// and SSH: what a connection costs before any pack is sent.
// The ls-refs answer comes from the cache after the first.
//
//	go test -run '^$' -bench ConnectionCost -benchtime 200x ./internal/server
//
// PACKWIRE_PROFILE_DIR=DIR writes one CPU profile per transport.
func BenchmarkConnectionCost(b *testing.B) {
	s := startServer(b, func(c *Config) { c.SSHAddr = "127.0.0.1:0" })
	key := s.env.NewSSHKey("id_conncost")
	pubBytes, err := os.ReadFile(key + ".pub")
	if err != nil {
		b.Fatal(err)
	}
	pub, _, _, _, err := gossh.ParseAuthorizedKey(pubBytes)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Data.Store.AddKey(context.Background(), "alice", store.Key{Fingerprint: gossh.FingerprintSHA256(pub), PublicKey: string(pubBytes)}); err != nil {
		b.Fatal(err)
	}
	sshEnv := gittest.SSHCommandEnv(key)
	name := "conncost/r"
	r, err := s.Data.Repos.Create(context.Background(), name)
	if err != nil {
		b.Fatal(err)
	}
	s.env.Build(r.Path, gittest.Shape{Commits: 50, Files: 30, BlobBytes: 300, Branches: 5, Tags: 20, Seed: 3})
	s.env.Git(r.Path, "pack-refs", "--all")
	profileDir := os.Getenv("PACKWIRE_PROFILE_DIR")
	for _, tc := range []struct {
		name    string
		version int
		url     string
	}{
		{"git-v2", 2, s.gitURL(name)},
		{"ssh-v2", 2, s.sshURL(name)},
		{"ssh-v0", 0, s.sshURL(name)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			env := append(append([]string{}, s.env.Vars...), "GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=protocol.version", "GIT_CONFIG_VALUE_0="+strconv.Itoa(tc.version), sshEnv)
			run := func(n int) {
				script := fmt.Sprintf("for i in $(seq %d); do git ls-remote %s >/dev/null || exit 1; done", n, tc.url)
				cmd := exec.Command("sh", "-c", script)
				cmd.Env = env
				if out, err := cmd.CombinedOutput(); err != nil {
					b.Fatalf("%v\n%s", err, out)
				}
			}
			run(2) // warm-up
			time.Sleep(100 * time.Millisecond)
			if profileDir != "" {
				fh, err := os.Create(filepath.Join(profileDir, "conn-"+tc.name+".pprof"))
				if err != nil {
					b.Fatal(err)
				}
				runtime.SetCPUProfileRate(2000)
				pprof.StartCPUProfile(fh)
				defer func() { pprof.StopCPUProfile(); fh.Close() }()
			}
			b.ResetTimer()
			cpu := selfCPU()
			run(b.N)
			b.StopTimer()
			b.ReportMetric(float64((selfCPU()-cpu).Microseconds())/1000/float64(b.N), "ms-self/conn")
		})
	}
}
