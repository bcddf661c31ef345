// Command lfs measures Git LFS as the issue states it. Downloads: `git lfs
// pull` of N objects (default 100 of 10 MiB, 1 GiB; git-lfs's default 8
// concurrent transfers) from packwire, and from nginx serving the same
// files statically (sendfile on; a static batch answer pointing at them),
// in interleaved rounds: wall, throughput and each server's CPU
// (utime+stime from /proc), medians and ratios. Uploads: `git push` of
// the same objects (git-lfs's pre-push upload) to a fresh repository each
// round, against writing the same files to the same disk (write + fsync
// each), with packwire's peak RSS above idle; -big N also PUTs one object
// of N bytes (5G for the 5 GiB) and reports the RSS it took.
//
//	go build -o /tmp/packwire ./cmd/packwire
//	go run ./bench/lfs -bin /tmp/packwire -objects 100 -size 10M -rounds 5
//
// Everything runs on loopback on one machine; the load is printed with the
// results.
package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"packwire/bench/internal/benchkit"
)

func main() {
	bin := flag.String("bin", "packwire", "packwire binary")
	nObjects := flag.Int("objects", 100, "LFS objects")
	sizeText := flag.String("size", "10M", "bytes per object (K, M, G suffixes)")
	rounds := flag.Int("rounds", 5, "interleaved rounds of each comparison")
	bigText := flag.String("big", "", "also upload one object of this size (5G: the issue's 5 GiB) and report packwire's RSS above idle")
	skipUpload := flag.Bool("no-upload", false, "skip the upload comparison")
	skipDownload := flag.Bool("no-download", false, "skip the download comparison")
	flag.Parse()
	size := parseSize(*sizeText)
	dir, err := os.MkdirTemp("", "bench-lfs-")
	check(err)
	defer os.RemoveAll(dir)
	stops = append(stops, func() { os.RemoveAll(dir) })
	data := filepath.Join(dir, "data")
	home := filepath.Join(dir, "home")
	check(os.MkdirAll(home, 0o700))
	env := append(os.Environ(), "HOME="+home, "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0")
	git := func(wd string, args ...string) string {
		cmd := exec.Command("git", args...)
		cmd.Dir, cmd.Env = wd, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	git(home, "config", "--global", "user.name", "bench")
	git(home, "config", "--global", "user.email", "bench@example.com")
	git(home, "config", "--global", "init.defaultBranch", "main")
	git(home, "lfs", "install")

	run(*bin, "init", "--data", data)
	run(*bin, "user", "add", "bench", "--data", data)
	repos := []string{"app"}
	for r := 0; r < *rounds; r++ {
		repos = append(repos, fmt.Sprintf("up%d", r))
	}
	for _, name := range repos {
		run(*bin, "repo", "create", name, "--data", data)
		run(*bin, "grant", "bench", "write", name, "--data", data)
	}
	out := run(*bin, "token", "create", "bench", "--data", data)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	token := lines[len(lines)-1]

	port := benchkit.FreePort()
	srv := exec.Command(*bin, "serve", "--data", data, "--http", "127.0.0.1:"+port, "--git", "", "--ssh", "", "--maintain-interval", "0")
	srv.Stderr = io.Discard
	check(srv.Start())
	stops = append(stops, func() { srv.Process.Kill(); srv.Wait() })
	defer stops[len(stops)-1]()
	benchkit.WaitPort(port)
	url := func(name string) string { return "http://bench:" + token + "@127.0.0.1:" + port + "/" + name + ".git" }

	// The source repository: N tracked files of random content.
	src := filepath.Join(dir, "src")
	check(os.MkdirAll(src, 0o755))
	git(src, "init", "-q")
	git(src, "lfs", "track", "*.bin")
	type object struct {
		oid  string
		size int64
	}
	var objects []object
	rng := rand.NewChaCha8([32]byte{1})
	for i := 0; i < *nObjects; i++ {
		name := filepath.Join(src, fmt.Sprintf("f%03d.bin", i))
		objects = append(objects, object{writeRandom(name, size, rng), size})
	}
	git(src, "add", ".")
	git(src, "commit", "-qm", "objects")
	total := float64(int64(len(objects)) * size)
	load := func() string { b, _ := os.ReadFile("/proc/loadavg"); return strings.TrimSpace(string(b)) }
	fmt.Printf("%d objects of %s (%.0f MiB); load at start %s\n\n", len(objects), *sizeText, total/(1<<20), load())

	// Uploads: git push (git-lfs uploads first) to a fresh repository each
	// round, against writing the same files (write + fsync) to the disk
	// packwire's data directory is on.
	srcFiles, _ := filepath.Glob(filepath.Join(src, "*.bin"))
	git(src, "remote", "add", "origin", url("app"))
	if !*skipUpload {
		var pushWalls, diskWalls []time.Duration
		var peak int64
		idle := rss(srv.Process.Pid)
		for r := 0; r < *rounds; r++ {
			push := func() {
				stop := sampleRSS(srv.Process.Pid, &peak)
				start := time.Now()
				git(src, "push", "-q", url(fmt.Sprintf("up%d", r)), "main")
				pushWalls = append(pushWalls, time.Since(start))
				stop()
			}
			disk := func() {
				start := time.Now()
				copyFiles(srcFiles, filepath.Join(data, "bench-disk"))
				diskWalls = append(diskWalls, time.Since(start))
				check(os.RemoveAll(filepath.Join(data, "bench-disk")))
			}
			if r%2 == 0 {
				push()
				disk()
			} else {
				disk()
				push()
			}
		}
		pw, dw := median(pushWalls), median(diskWalls)
		fmt.Printf("## Upload (%d interleaved rounds; load %s)\n\n", *rounds, load())
		fmt.Printf("| peer | wall (median) | MiB/s | all walls |\n|---|---|---|---|\n")
		fmt.Printf("| packwire (git push, LFS upload) | %s | %.0f | %v |\n", pw.Round(time.Millisecond), total/(1<<20)/pw.Seconds(), roundAll(pushWalls))
		fmt.Printf("| write + fsync to the same disk | %s | %.0f | %v |\n", dw.Round(time.Millisecond), total/(1<<20)/dw.Seconds(), roundAll(diskWalls))
		fmt.Printf("\nthroughput packwire/disk: %.2fx; packwire RSS idle %d MiB, peak during uploads %d MiB (+%d MiB)\n\n",
			dw.Seconds()/pw.Seconds(), idle>>20, peak>>20, (peak-idle)>>20)
	}
	git(src, "push", "-q", "origin", "main")
	if *bigText != "" {
		bigUpload(filepath.Join(dir, "big.bin"), parseSize(*bigText), srv.Process.Pid, "http://127.0.0.1:"+port+"/app.git/info/lfs/objects/", token)
	}

	if *skipDownload {
		return
	}

	// nginx serves DATA/lfs/objects as static files (sendfile on) and a
	// static batch answer whose hrefs point at them: the static module
	// refuses a POST to an existing file (405), which error_page turns
	// into a GET of it.
	nport := benchkit.FreePort()
	ndir := filepath.Join(dir, "nginx")
	check(os.MkdirAll(filepath.Join(ndir, "www", "lfs", "objects"), 0o755))
	type action struct {
		Href string `json:"href"`
	}
	type batchObject struct {
		OID     string            `json:"oid"`
		Size    int64             `json:"size"`
		Actions map[string]action `json:"actions"`
	}
	answer := struct {
		Transfer string        `json:"transfer"`
		Objects  []batchObject `json:"objects"`
	}{Transfer: "basic"}
	for _, o := range objects {
		answer.Objects = append(answer.Objects, batchObject{o.oid, o.size, map[string]action{
			"download": {"http://127.0.0.1:" + nport + "/objects/" + o.oid[0:2] + "/" + o.oid[2:4] + "/" + o.oid}}})
	}
	b, err := json.Marshal(answer)
	check(err)
	check(os.WriteFile(filepath.Join(ndir, "www", "lfs", "objects", "batch"), b, 0o644))
	conf := fmt.Sprintf(`daemon off; master_process off; worker_processes 1; pid %[1]s/nginx.pid; error_log %[1]s/error.log;
events { worker_connections 256; }
http { access_log off; sendfile on; tcp_nopush on; keepalive_requests 100000;
  client_body_temp_path %[1]s; proxy_temp_path %[1]s; fastcgi_temp_path %[1]s; uwsgi_temp_path %[1]s; scgi_temp_path %[1]s;
  server { listen 127.0.0.1:%[2]s;
    location = /lfs/objects/batch { root %[1]s/www; default_type application/vnd.git-lfs+json; error_page 405 =200 $uri; }
    location /objects/ { root %[3]s; } } }
`, ndir, nport, filepath.Join(data, "lfs"))
	check(os.WriteFile(filepath.Join(ndir, "nginx.conf"), []byte(conf), 0o644))
	ngx := exec.Command("nginx", "-p", ndir, "-c", filepath.Join(ndir, "nginx.conf"), "-e", filepath.Join(ndir, "error.log"))
	ngx.Stderr = os.Stderr
	check(ngx.Start())
	stops = append(stops, func() { ngx.Process.Kill(); ngx.Wait() })
	defer stops[len(stops)-1]()
	benchkit.WaitPort(nport)

	// Downloads: a clone without the objects, then per round and peer the
	// objects removed and `git lfs pull` again.
	dst := filepath.Join(dir, "dst")
	cmd := exec.Command("git", "clone", "-q", url("app"), dst)
	cmd.Env = append(env, "GIT_LFS_SKIP_SMUDGE=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		fatalf("clone: %v\n%s", err, out)
	}
	type peer struct {
		name   string
		lfsURL string
		pid    int
	}
	peers := []peer{
		{"packwire", "", srv.Process.Pid},
		{"nginx", "http://127.0.0.1:" + nport + "/lfs", ngx.Process.Pid},
	}
	walls := map[string][]time.Duration{}
	cpus := map[string][]time.Duration{}
	for r := 0; r < *rounds; r++ {
		order := peers
		if r%2 == 1 {
			order = []peer{peers[1], peers[0]}
		}
		for _, p := range order {
			check(os.RemoveAll(filepath.Join(dst, ".git", "lfs", "objects")))
			pulled, _ := filepath.Glob(filepath.Join(dst, "*.bin"))
			for _, f := range pulled {
				check(os.Remove(f))
			}
			cmd := exec.Command("git", "checkout", "-q", "--", ".") // the pointers again
			cmd.Dir, cmd.Env = dst, append(env, "GIT_LFS_SKIP_SMUDGE=1")
			if out, err := cmd.CombinedOutput(); err != nil {
				fatalf("checkout: %v\n%s", err, out)
			}
			args := []string{"lfs", "pull"}
			if p.lfsURL != "" {
				args = append([]string{"-c", "lfs.url=" + p.lfsURL}, args...)
			}
			cpu0 := procCPU(p.pid)
			start := time.Now()
			git(dst, args...)
			walls[p.name] = append(walls[p.name], time.Since(start))
			cpus[p.name] = append(cpus[p.name], procCPU(p.pid)-cpu0)
			verify(dst, objects[0].oid)
		}
	}
	fmt.Printf("## Download: git lfs pull (%d interleaved rounds; load %s)\n\n", *rounds, load())
	fmt.Printf("| server | wall (median) | MiB/s | server CPU (median) | all walls | all CPU |\n|---|---|---|---|---|---|\n")
	med := map[string]time.Duration{}
	medCPU := map[string]time.Duration{}
	for _, p := range peers {
		w, c := median(walls[p.name]), median(cpus[p.name])
		med[p.name], medCPU[p.name] = w, c
		fmt.Printf("| %s | %s | %.0f | %s | %v | %v |\n", p.name, w.Round(time.Millisecond), total/(1<<20)/w.Seconds(), c, roundAll(walls[p.name]), cpus[p.name])
	}
	cpuRatio := "n/a (nginx's under one 10 ms tick: use more or larger objects)"
	if medCPU["nginx"] > 0 {
		cpuRatio = fmt.Sprintf("%.2fx", medCPU["packwire"].Seconds()/medCPU["nginx"].Seconds())
	}
	fmt.Printf("\nthroughput packwire/nginx: %.2fx; server CPU packwire/nginx: %s\n", med["nginx"].Seconds()/med["packwire"].Seconds(), cpuRatio)
}

// writeRandom writes size random bytes to name and returns their SHA-256.
func writeRandom(name string, size int64, rng io.Reader) string {
	f, err := os.Create(name)
	check(err)
	h := sha256.New()
	_, err = io.CopyN(io.MultiWriter(f, h), rng, size)
	check(err)
	check(f.Close())
	return hex.EncodeToString(h.Sum(nil))
}

// copyFiles writes each file into dir as packwire stores an object: one
// write stream and an fsync per file.
func copyFiles(files []string, dir string) {
	check(os.MkdirAll(dir, 0o755))
	for _, name := range files {
		in, err := os.Open(name)
		check(err)
		out, err := os.Create(filepath.Join(dir, filepath.Base(name)))
		check(err)
		_, err = io.Copy(out, in)
		check(err)
		check(out.Sync())
		check(out.Close())
		in.Close()
	}
}

// bigUpload PUTs one object of size bytes (streamed from a file) and
// prints packwire's RSS peak above idle during it.
func bigUpload(name string, size int64, pid int, base, token string) {
	oid := writeRandom(name, size, rand.NewChaCha8([32]byte{2}))
	defer os.Remove(name)
	f, err := os.Open(name)
	check(err)
	defer f.Close()
	idle := rss(pid)
	var peak int64
	stop := sampleRSS(pid, &peak)
	start := time.Now()
	req, _ := http.NewRequest("PUT", base+oid, f)
	req.ContentLength = size
	req.SetBasicAuth("bench", token)
	resp, err := http.DefaultClient.Do(req)
	check(err)
	resp.Body.Close()
	wall := time.Since(start)
	stop()
	if resp.StatusCode != 200 {
		fatalf("big upload: %s", resp.Status)
	}
	fmt.Printf("## One object of %d MiB by PUT\n\nwall %s (%.0f MiB/s); packwire RSS idle %d MiB, peak %d MiB (+%d MiB)\n\n",
		size>>20, wall.Round(time.Millisecond), float64(size)/(1<<20)/wall.Seconds(), idle>>20, peak>>20, (peak-idle)>>20)
}

// sampleRSS records pid's largest RSS into peak every 20 ms until stopped.
func sampleRSS(pid int, peak *int64) (stop func()) {
	var done atomic.Bool
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for !done.Load() {
			*peak = max(*peak, rss(pid))
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return func() { done.Store(true); <-finished }
}

// rss is a process's resident set (VmRSS) in bytes.
func rss(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	check(err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// verify checks that the pull left the first object's content in place.
func verify(dst, oid string) {
	b, err := os.ReadFile(filepath.Join(dst, "f000.bin"))
	check(err)
	sum := sha256.Sum256(b)
	if hex.EncodeToString(sum[:]) != oid {
		fatalf("f000.bin after the pull is not the object (%d bytes)", len(b))
	}
}

// procCPU is a process's utime+stime from /proc/PID/stat (clock ticks of 10 ms).
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	check(err)
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

func median(v []time.Duration) time.Duration {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func roundAll(v []time.Duration) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, d := range v {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

func parseSize(s string) int64 {
	mult := int64(1)
	for suffix, m := range map[string]int64{"K": 1 << 10, "M": 1 << 20, "G": 1 << 30} {
		if v, ok := strings.CutSuffix(s, suffix); ok {
			mult, s = m, v
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	check(err)
	return n * mult
}

func run(bin string, args ...string) string {
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		fatalf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func check(err error) {
	if err != nil {
		fatalf("%v", err)
	}
}

// stops are the servers to stop; fatalf stops them (log.Fatal would skip
// the deferred kills and leave them running).
var stops []func()

func fatalf(format string, args ...any) {
	for i := len(stops) - 1; i >= 0; i-- {
		stops[i]()
	}
	log.Fatalf(format, args...)
}
