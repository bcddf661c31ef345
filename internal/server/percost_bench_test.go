//go:build unix

package server

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"packwire/internal/gittest"
	"packwire/internal/repostate"
	"packwire/internal/store"
)

// BenchmarkPerRequestCost measures packwire's own CPU (this process's
// rusage: the in-process server, not git, whose children are counted
// apart) per request, per transport: a herd of 16 CI runners at the same
// commit fetching after a push against one such runner, and repeated
// clones of an unchanged repository. The herd's git run is shared, so
// (herd - one) / 15 is what each further runner costs packwire. Every
// client command is started through one shell, so the harness's own
// spawning costs the herd and the single fetch alike.
//
//	go test -run '^$' -bench PerRequestCost -benchtime 5x ./internal/server
//
// PACKWIRE_PROFILE_DIR=DIR writes CPU profiles of every measured operation
// (DIR/herd-TRANSPORT-N.pprof, one-..., clone-...).
func BenchmarkPerRequestCost(b *testing.B) {
	s := startServer(b, func(c *Config) { c.SSHAddr = "127.0.0.1:0" })
	// The same server without SSH output pacing, to show what pacing costs.
	unpaced := startServer(b, func(c *Config) { c.SSHAddr, c.SSHMaxUnacked = "127.0.0.1:0", 0 })
	key := s.env.NewSSHKey("id_percost")
	pubBytes, err := os.ReadFile(key + ".pub")
	if err != nil {
		b.Fatal(err)
	}
	pub, _, _, _, err := gossh.ParseAuthorizedKey(pubBytes)
	if err != nil {
		b.Fatal(err)
	}
	for _, srv := range []*testServer{s, unpaced} {
		if err := srv.Data.Store.AddKey(context.Background(), "alice", store.Key{Fingerprint: gossh.FingerprintSHA256(pub), PublicKey: string(pubBytes)}); err != nil {
			b.Fatal(err)
		}
	}
	sshEnv := gittest.SSHCommandEnv(key)
	profileDir := os.Getenv("PACKWIRE_PROFILE_DIR")

	cases := []struct {
		name    string
		version int
		srv     *testServer
		url     func(string) string
	}{
		{"git-v2", 2, s, s.gitURL},
		{"http-v0", 0, s, s.httpURL},
		{"http-v2", 2, s, s.httpURL},
		{"ssh-v2", 2, s, s.sshURL},
		{"ssh-v2-unpaced", 2, unpaced, unpaced.sshURL},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			// b.Run calls this again with a larger b.N: the repository is made once.
			s := tc.srv
			name := "percost/" + tc.name
			r, err := s.Data.Repos.Create(context.Background(), name)
			if err == nil {
				s.env.Build(r.Path, gittest.Shape{Commits: 400, Files: 300, BlobBytes: 3000, Branches: 5, Tags: 20, Seed: 3})
				s.env.Git(r.Path, "pack-refs", "--all") // as maintenance leaves it
			} else if r, err = s.Data.Repos.Resolve(name); err != nil {
				b.Fatal(err)
			}
			dir := b.TempDir()
			work := filepath.Join(dir, "work")
			s.env.Git("", "clone", "-q", r.Path, work)
			env := []string{"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=protocol.version", "GIT_CONFIG_VALUE_0=" + strconv.Itoa(tc.version), sshEnv}
			// shell runs one command line with the client's environment.
			shell := func(script string) {
				cmd := exec.Command("sh", "-c", script)
				cmd.Env = append(append([]string{}, s.env.Vars...), env...)
				if out, err := cmd.CombinedOutput(); err != nil {
					b.Fatalf("%s: %v\n%s", script, err, out)
				}
			}
			const herd = 16
			runners := filepath.Join(dir, "runners")
			prepare := func(n int) {
				os.RemoveAll(runners)
				base := filepath.Join(runners, "base")
				s.env.Git("", "clone", "-q", "--bare", r.Path, base)
				s.env.Git(base, "remote", "set-url", "origin", tc.url(name))
				for i := 0; i < n; i++ {
					if out, err := exec.Command("cp", "-a", base, filepath.Join(runners, strconv.Itoa(i))).CombinedOutput(); err != nil {
						b.Fatalf("cp: %v %s", err, out)
					}
				}
				s.env.Git(work, "commit", "-q", "--allow-empty", "-m", "ci "+strconv.Itoa(n))
				s.env.Git(work, "push", "-q", "origin", "HEAD:main")
				time.Sleep(2 * repostate.RacyWindow)
			}
			fetchAll := func(n int) string {
				var sb strings.Builder
				for i := 0; i < n; i++ {
					fmt.Fprintf(&sb, "git -C %s fetch -q origin & ", filepath.Join(runners, strconv.Itoa(i)))
				}
				sb.WriteString("wait")
				return sb.String()
			}
			clone := fmt.Sprintf("rm -rf %[1]s && git clone -q --bare %[2]s %[1]s", filepath.Join(dir, "clone"), tc.url(name))
			shell(clone) // warm-up: the answer is stored

			var herdCPU, oneCPU, cloneCPU []time.Duration
			var herdGoroutines, oneGoroutines []time.Duration // counts, as durations for med
			var spawned uint64                                // goroutines the last profiled call created
			profiles := 0
			// profiled returns the CPU f costs this process; with
			// PACKWIRE_PROFILE_DIR, it writes f's profile (one file per
			// call: merge them with go tool pprof -proto).
			profiled := func(file string, f func()) time.Duration {
				if profileDir != "" {
					profiles++
					fh, err := os.Create(filepath.Join(profileDir, fmt.Sprintf("%s-%s-%03d.pprof", file, tc.name, profiles)))
					if err != nil {
						b.Fatal(err)
					}
					runtime.SetCPUProfileRate(2000) // 100 Hz sees a few samples per herd
					pprof.StartCPUProfile(fh)
					defer func() { pprof.StopCPUProfile(); fh.Close() }()
				}
				cpu, created := selfCPU(), goroutinesCreated()
				f()
				spawned = goroutinesCreated() - created
				return selfCPU() - cpu
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				prepare(herd)
				b.StartTimer()
				herdCPU = append(herdCPU, profiled("herd", func() { shell(fetchAll(herd)) }))
				herdGoroutines = append(herdGoroutines, time.Duration(spawned))
				b.StopTimer()
				prepare(1)
				b.StartTimer()
				oneCPU = append(oneCPU, profiled("one", func() { shell(fetchAll(1)) }))
				oneGoroutines = append(oneGoroutines, time.Duration(spawned))
				for j := 0; j < 4; j++ {
					cloneCPU = append(cloneCPU, profiled("clone", func() { shell(clone) }))
				}
			}
			med := func(d []time.Duration) time.Duration {
				d = slices.Clone(d)
				slices.Sort(d)
				return d[len(d)/2]
			}
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
			b.ReportMetric(ms(med(herdCPU)), "ms-self/herd16")
			b.ReportMetric(ms(med(oneCPU)), "ms-self/fetch1")
			b.ReportMetric(ms(med(herdCPU)-med(oneCPU))/(herd-1), "ms-self/extra-runner")
			b.ReportMetric(ms(med(cloneCPU)), "ms-self/repeat-clone")
			b.ReportMetric(float64(med(herdGoroutines)-med(oneGoroutines))/(herd-1), "goroutines/extra-runner")
		})
	}
}

// goroutinesCreated is how many goroutines this process has started so far.
func goroutinesCreated() uint64 {
	sample := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return sample[0].Value.Uint64()
}

// selfCPU is this process's user + system CPU so far (git children not
// included: they are RUSAGE_CHILDREN).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
