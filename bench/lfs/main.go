// Command lfs measures LFS downloads: N objects fetched by 8 concurrent
// HTTP clients (git-lfs's default concurrency) from packwire's LFS API and
// from nginx serving the same files statically, in interleaved rounds;
// wall, throughput and each server's CPU (utime+stime of its process from
// /proc), medians and the ratio packwire/nginx.
//
//	go build -o /tmp/packwire ./cmd/packwire
//	go run ./bench/lfs -bin /tmp/packwire -objects 40 -size 4M -rounds 5
//
// Both servers run on loopback on the same machine as the clients; the
// machine's load is printed with the results.
package main

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"packwire/bench/internal/benchkit"
)

const concurrency = 8

func main() {
	bin := flag.String("bin", "packwire", "packwire binary")
	nObjects := flag.Int("objects", 40, "objects")
	sizeText := flag.String("size", "4M", "bytes per object (K, M suffixes)")
	rounds := flag.Int("rounds", 5, "interleaved rounds")
	flag.Parse()
	size := parseSize(*sizeText)
	dir, err := os.MkdirTemp("", "bench-lfs-")
	check(err)
	defer os.RemoveAll(dir)
	data := filepath.Join(dir, "data")

	run(*bin, "init", "--data", data)
	run(*bin, "repo", "create", "app", "--data", data)
	run(*bin, "user", "add", "bench", "--data", data)
	run(*bin, "grant", "bench", "write", "app", "--data", data)
	out := run(*bin, "token", "create", "bench", "--data", data)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	token := lines[len(lines)-1]

	port := benchkit.FreePort()
	srv := exec.Command(*bin, "serve", "--data", data, "--http", "127.0.0.1:"+port, "--git", "", "--ssh", "", "--maintain-interval", "0")
	srv.Stderr = io.Discard
	check(srv.Start())
	defer func() { srv.Process.Kill(); srv.Wait() }()
	benchkit.WaitPort(port)
	base := "http://127.0.0.1:" + port + "/app.git/info/lfs/objects/"

	// Upload N random objects through the API.
	var oids []string
	for i := 0; i < *nObjects; i++ {
		b := make([]byte, size)
		rand.Read(b)
		sum := sha256.Sum256(b)
		oid := hex.EncodeToString(sum[:])
		req, _ := http.NewRequest("PUT", base+oid, bytes.NewReader(b))
		req.SetBasicAuth("bench", token)
		resp, err := http.DefaultClient.Do(req)
		check(err)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			log.Fatalf("upload: %s", resp.Status)
		}
		oids = append(oids, oid)
	}

	// nginx serves DATA/lfs/objects as static files (sendfile on).
	nport := benchkit.FreePort()
	ndir := filepath.Join(dir, "nginx")
	check(os.MkdirAll(ndir, 0o755))
	conf := fmt.Sprintf(`daemon off; master_process off; worker_processes 1; pid %s/nginx.pid; error_log %s/error.log;
events { worker_connections 256; }
http { access_log off; sendfile on; tcp_nopush on; keepalive_requests 100000;
  client_body_temp_path %s; proxy_temp_path %s; fastcgi_temp_path %s; uwsgi_temp_path %s; scgi_temp_path %s;
  server { listen 127.0.0.1:%s; root %s; location / { } } }
`, ndir, ndir, ndir, ndir, ndir, ndir, ndir, nport, filepath.Join(data, "lfs"))
	check(os.WriteFile(filepath.Join(ndir, "nginx.conf"), []byte(conf), 0o644))
	ngx := exec.Command("nginx", "-p", ndir, "-c", filepath.Join(ndir, "nginx.conf"), "-e", filepath.Join(ndir, "error.log"))
	ngx.Stderr = os.Stderr
	check(ngx.Start())
	defer func() { ngx.Process.Kill(); ngx.Wait() }()
	benchkit.WaitPort(nport)
	nbase := "http://127.0.0.1:" + nport + "/objects/"

	type peer struct {
		name string
		url  func(oid string) string
		auth bool
		pid  int
	}
	peers := []peer{
		{"packwire", func(o string) string { return base + o }, true, srv.Process.Pid},
		{"nginx", func(o string) string { return nbase + o[0:2] + "/" + o[2:4] + "/" + o }, false, ngx.Process.Pid},
	}
	walls := map[string][]time.Duration{}
	cpus := map[string][]time.Duration{}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: concurrency}}
	for r := 0; r < *rounds; r++ {
		order := peers
		if r%2 == 1 {
			order = []peer{peers[1], peers[0]}
		}
		for _, p := range order {
			cpu0 := procCPU(p.pid)
			start := time.Now()
			fetchAll(client, oids, size, p.url, p.auth, token)
			walls[p.name] = append(walls[p.name], time.Since(start))
			cpus[p.name] = append(cpus[p.name], procCPU(p.pid)-cpu0)
		}
	}
	total := float64(int64(len(oids)) * size)
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("%d objects of %s (%.0f MiB), %d concurrent GETs, %d interleaved rounds; load %s", len(oids), *sizeText, total/(1<<20), concurrency, *rounds, load)
	fmt.Printf("| server | wall (median) | MiB/s | server CPU (median) | all walls |\n|---|---|---|---|---|\n")
	med := map[string]time.Duration{}
	medCPU := map[string]time.Duration{}
	for _, p := range peers {
		w := median(walls[p.name])
		c := median(cpus[p.name])
		med[p.name], medCPU[p.name] = w, c
		fmt.Printf("| %s | %s | %.0f | %s | %v |\n", p.name, w.Round(time.Millisecond), total/(1<<20)/w.Seconds(), c.Round(time.Millisecond), roundAll(walls[p.name]))
	}
	fmt.Printf("throughput packwire/nginx: %.2fx; CPU packwire/nginx: %.2fx\n",
		med["nginx"].Seconds()/med["packwire"].Seconds(), medCPU["packwire"].Seconds()/max(medCPU["nginx"].Seconds(), 1e-9))
}

// fetchAll downloads every object with concurrency workers and checks sizes.
func fetchAll(c *http.Client, oids []string, size int64, url func(string) string, auth bool, token string) {
	work := make(chan string)
	var wg sync.WaitGroup
	for i := 0; i < concurrency; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for oid := range work {
				req, _ := http.NewRequest("GET", url(oid), nil)
				if auth {
					req.SetBasicAuth("bench", token)
				}
				resp, err := c.Do(req)
				check(err)
				n, err := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				check(err)
				if resp.StatusCode != 200 || n != size {
					log.Fatalf("GET %s: %s, %d bytes", url(oid), resp.Status, n)
				}
			}
		}()
	}
	for _, o := range oids {
		work <- o
	}
	close(work)
	wg.Wait()
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
	switch {
	case strings.HasSuffix(s, "K"):
		mult, s = 1<<10, strings.TrimSuffix(s, "K")
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, strings.TrimSuffix(s, "M")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	check(err)
	return n * mult
}

func run(bin string, args ...string) string {
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		log.Fatalf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
