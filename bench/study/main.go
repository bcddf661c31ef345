// Command study replays the clone/fetch study (T1-T10, `packwire bench`)
// against packwire and against nginx + fcgiwrap + git-http-backend, one
// after the other, on the same synth repository served from the same files,
// and leaves both reports side by side. Server CPU comes from each
// server's cgroup, the whole server in both cases (for packwire that is git
// plus its HTTP relay; its governor would count git alone).
//
// Run as root (cgroups; apt-get installs nginx and fcgiwrap when missing):
//
//	go run ./bench/study -users 2 -duration 15s -out bench/out/study
package main

import (
	"flag"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"packwire/bench/internal/benchkit"
)

func main() {
	outDir := flag.String("out", "bench/out/study", "work directory; reports go to OUT/reports/{packwire,packwire-nocache,nginx}")
	shape := flag.String("shape", "jquery", "synth shape")
	scale := flag.Float64("scale", 1, "synth scale")
	users := flag.String("users", "2", "simulated users (packwire bench --users)")
	duration := flag.String("duration", "15s", "time per scenario (packwire bench --duration)")
	pusher := flag.String("pusher-interval", "2s", "pusher interval (packwire bench --pusher-interval)")
	flag.Parse()
	log.SetFlags(log.Ltime)
	benchkit.StopOnSignal()
	if os.Geteuid() != 0 {
		log.Fatal("study needs root: one cgroup per server")
	}
	out, _ := filepath.Abs(*outDir)
	os.RemoveAll(out)
	data := filepath.Join(out, "data")
	repos := filepath.Join(data, "repos")
	if err := os.MkdirAll(repos, 0o755); err != nil {
		log.Fatal(err)
	}
	bin := filepath.Join(out, "packwire")
	benchkit.Run("go", "build", "-o", bin, "./cmd/packwire")
	benchkit.Run(bin, "synth", "--shape", *shape, "--scale", strconv.FormatFloat(*scale, 'g', -1, 64), "--out", filepath.Join(repos, "jq.git"), "--quiet")
	benchkit.Run(bin, "maintain", "--data", data) // both servers serve the maintained files
	// What packwire serves every repository with (gitexec.ServedConfig),
	// set in the repository for git-http-backend: without allowFilter it
	// ignores --filter and T3/T4 are full clones (git only warns).
	for _, kv := range [][2]string{{"http.receivepack", "true"}, {"uploadpack.allowFilter", "true"}, {"uploadpack.allowAnySHA1InWant", "true"}} {
		benchkit.Run("git", "-C", filepath.Join(repos, "jq.git"), "config", kv[0], kv[1])
	}
	token := adminToken(bin, data)

	port := benchkit.FreePort()
	pw := benchkit.StartPackwire("study-packwire", bin, data, filepath.Join(out, "packwire.log"), port,
		"--maintain-interval", "0", "--git=", "--ssh=", "--http", "127.0.0.1:"+port)
	// The same packwire without the fetch cache: what generating every
	// clone costs (the default replays identical clones of an unchanged repo).
	nocacheData := filepath.Join(out, "data-nocache")
	benchkit.ShareRepos(nocacheData, repos)
	nocacheToken := adminToken(bin, nocacheData)
	nocachePort := benchkit.FreePort()
	pwNoCache := benchkit.StartPackwire("study-packwire-nocache", bin, nocacheData, filepath.Join(out, "packwire-nocache.log"), nocachePort,
		"--maintain-interval", "0", "--git=", "--ssh=", "--http", "127.0.0.1:"+nocachePort, "--fetch-cache=false")
	defer pwNoCache.Stop()
	ngx := benchkit.StartNginx("study-nginx", filepath.Join(out, "nginx"), repos)
	defer pw.Stop()
	defer ngx.Stop()

	common := []string{"bench", "--users", *users, "--duration", *duration, "--pusher-interval", *pusher, "--data", data}
	run := func(name string, args ...string) {
		log.Printf("packwire bench against %s ...", name)
		cmd := exec.Command(bin, append(append(append([]string{}, common...), "--out", filepath.Join(out, "reports", name)), args...)...)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			benchkit.Fatalf("%s: %v", name, err)
		}
	}
	// The pusher pushes with the token in both runs (nginx ignores it: its
	// REMOTE_USER is fixed), so both servers see the same traffic.
	run("packwire", "--url", "http://lab:"+token+"@127.0.0.1:"+port+"/jq.git", "--server-cgroup", pw.Group.CPUDir())
	run("packwire-nocache", "--url", "http://lab:"+nocacheToken+"@127.0.0.1:"+nocachePort+"/jq.git", "--server-cgroup", pwNoCache.Group.CPUDir())
	run("nginx", "--url", "http://lab:"+token+"@127.0.0.1:"+ngx.Port+"/jq.git", "--server-cgroup", ngx.Group.CPUDir())
	log.Printf("reports: %s", filepath.Join(out, "reports"))
}

// adminToken makes user "lab" an admin of data's server and returns a token.
func adminToken(bin, data string) string {
	benchkit.Run(bin, "user", "add", "lab", "--data", data)
	benchkit.Run(bin, "grant", "lab", "admin", "**", "--data", data)
	tok := strings.Fields(benchkit.Output(bin, "token", "create", "lab", "--data", data))
	return tok[len(tok)-1]
}
