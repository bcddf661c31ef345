// Command clone measures a full clone of one repository (>= 20 MB) over
// packwire's three transports against `git clone --no-local file://` and
// git daemon, all in the same run, rounds interleaved in a fresh random
// order each time, and prints medians, spread, ratios and server CPU.
// packwire runs with its defaults, so over HTTP (protocol v2) every clone
// after the first is replayed from the fetch cache; -fetch-cache=false
// measures a pack generated each time.
//
//	go run ./bench/clone -rounds 7 -out bench/out/clone
package main

import (
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"packwire/bench/internal/benchkit"
)

type target struct {
	name   string
	url    string
	env    []string        // extra client environment
	server *benchkit.Group // the server's CPU; nil: not a server
}

type sample struct{ wall, serverCPU time.Duration }

func main() {
	rounds := flag.Int("rounds", 7, "clones per target")
	outDir := flag.String("out", "bench/out/clone", "work directory (repository, data, clones)")
	src := flag.String("src", runtime.GOROOT()+"/src", "source tree the benchmark history is made from")
	only := flag.String("only", "", "comma-separated substrings: run only targets whose name contains one")
	fetchCache := flag.Bool("fetch-cache", true, "packwire's fetch cache (HTTP v2 clones after the first are replays)")
	flag.Parse()
	log.SetFlags(0)
	benchkit.StopOnSignal()
	must := func(err error) {
		if err != nil {
			benchkit.Fatalf("%v", err)
		}
	}
	out, _ := filepath.Abs(*outDir)
	os.RemoveAll(out)
	must(os.MkdirAll(out, 0o755))

	home := filepath.Join(out, "home")
	os.MkdirAll(home, 0o700)
	clientEnv := []string{"HOME=" + home, "PATH=" + os.Getenv("PATH"), "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0", "LC_ALL=C"}

	bare := filepath.Join(out, "bench.git")
	log.Printf("building benchmark repository from %s ...", *src)
	must(benchkit.BuildRepo(*src, bare, 400))
	packSize := benchkit.DirSize(filepath.Join(bare, "objects", "pack"))

	bin := filepath.Join(out, "packwire")
	benchkit.Run("go", "build", "-o", bin, "./cmd/packwire")
	data := filepath.Join(out, "data")
	benchkit.Run(bin, "repo", "import", "bench", bare, "--data", data, "--no-maintain") // measured as git gc packs it
	imported := filepath.Join(data, "repos", "bench.git")
	benchkit.Run("git", "-C", imported, "repack", "-adbq", "--write-bitmap-index")

	gitPort, httpPort, sshPort := benchkit.FreePort(), benchkit.FreePort(), benchkit.FreePort()
	srv := benchkit.StartPackwire("packwire", bin, data, filepath.Join(out, "packwire.log"), gitPort, "--maintain-interval", "0",
		"--fetch-cache="+strconv.FormatBool(*fetchCache), "--git", "127.0.0.1:"+gitPort, "--http", "127.0.0.1:"+httpPort, "--ssh", "127.0.0.1:"+sshPort)
	defer srv.Stop()
	benchkit.WaitPort(httpPort)
	benchkit.WaitPort(sshPort)
	packwireCPU := srv.Group
	// The peer: git daemon serving the same repository directory.
	daemon := benchkit.StartGitDaemon("git-daemon", filepath.Join(data, "repos"), clientEnv)
	defer daemon.Stop()
	daemonCPU, daemonPort := daemon.Group, daemon.Port

	key := filepath.Join(home, "id_ed25519")
	benchkit.Run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key)
	sshBase := "ssh -F /dev/null -i " + key + " -o IdentitiesOnly=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o BatchMode=yes"

	targets := []target{
		{name: "file:// --no-local", url: "file://" + imported},
		{name: "git daemon (git://)", url: "git://127.0.0.1:" + daemonPort + "/bench.git", server: daemonCPU},
		{name: "packwire git://", url: "git://127.0.0.1:" + gitPort + "/bench", server: packwireCPU},
		{name: "packwire http://", url: "http://127.0.0.1:" + httpPort + "/bench.git", server: packwireCPU},
		{name: "packwire ssh (client default cipher)", url: "ssh://git@127.0.0.1:" + sshPort + "/bench.git", env: []string{"GIT_SSH_COMMAND=" + sshBase}, server: packwireCPU},
		{name: "packwire ssh (aes128-gcm)", url: "ssh://git@127.0.0.1:" + sshPort + "/bench.git", env: []string{"GIT_SSH_COMMAND=" + sshBase + " -c aes128-gcm@openssh.com"}, server: packwireCPU},
	}
	if *only != "" {
		var kept []target
		for _, t := range targets {
			for _, o := range strings.Split(*only, ",") {
				if strings.Contains(t.name, o) {
					kept = append(kept, t)
					break
				}
			}
		}
		targets = kept
	}
	results := map[string][]sample{}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	// One warm-up clone per target (page cache, first-start costs), not counted.
	for r := -1; r < *rounds; r++ {
		order := rng.Perm(len(targets))
		for _, i := range order {
			t := targets[i]
			dst := filepath.Join(out, "clone")
			os.RemoveAll(dst)
			cpu0 := t.server.Read()
			start := time.Now()
			cmd := exec.Command("git", "clone", "-q", "--no-local", t.url, dst)
			cmd.Env = append(append([]string{}, clientEnv...), t.env...)
			if b, err := cmd.CombinedOutput(); err != nil {
				benchkit.Fatalf("%s: %v\n%s", t.name, err, b)
			}
			wall := time.Since(start)
			// The server's accounting of a finished request can trail the
			// client's exit by a moment: let the git child be reaped.
			time.Sleep(100 * time.Millisecond)
			cpu := t.server.Read() - cpu0
			if r >= 0 {
				results[t.name] = append(results[t.name], sample{wall, cpu})
			}
			fmt.Fprintf(os.Stderr, "\rround %d/%d %-40s %6.2fs", r+1, *rounds, t.name, wall.Seconds())
		}
	}
	fmt.Fprintln(os.Stderr)

	gitVersion := strings.TrimSpace(benchkit.Output("git", "--version"))
	sshVersion := strings.TrimSpace(benchkit.Output("ssh", "-V"))
	fmt.Printf("Full clone, %s repository (%d objects, pack %.1f MiB), %d rounds after 1 warm-up, order shuffled each round.\n",
		"Go-source-shaped", benchkit.CountObjects(imported), float64(packSize)/(1<<20), *rounds)
	fmt.Printf("%s, %s, %d CPUs, %s, %s\n\n", gitVersion, sshVersion, runtime.NumCPU(), runtime.Version(), time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Printf("Server CPU from %s. packwire's fetch cache: %v", packwireCPU.Source(), *fetchCache)
	if *fetchCache {
		fmt.Print(" (HTTP clones after the first are replays, no git run)")
	}
	fmt.Print(".\n\n")
	fmt.Println("| target | median wall | min - max | wall / first row | server CPU (median) |")
	fmt.Println("|---|---:|---:|---:|---:|")
	base := median(results[targets[0].name], func(s sample) time.Duration { return s.wall })
	for _, t := range targets {
		s := results[t.name]
		m := median(s, func(s sample) time.Duration { return s.wall })
		lo, hi := s[0].wall, s[0].wall
		for _, x := range s {
			lo, hi = min(lo, x.wall), max(hi, x.wall)
		}
		cpu := "-"
		if t.server != nil {
			cpu = fmt.Sprintf("%.2f s", median(s, func(s sample) time.Duration { return s.serverCPU }).Seconds())
		}
		fmt.Printf("| %s | %.2f s | %.2f - %.2f s | %.3fx | %s |\n", t.name, m.Seconds(), lo.Seconds(), hi.Seconds(), m.Seconds()/base.Seconds(), cpu)
	}
}

// median of one measure of the samples.
func median(s []sample, f func(sample) time.Duration) time.Duration {
	v := make([]time.Duration, len(s))
	for i, x := range s {
		v[i] = f(x)
	}
	return benchkit.Median(v)
}
