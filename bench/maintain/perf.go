package main

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"packwire/bench/internal/benchkit"
)

// perfSample is one sample of `perf script`: the process name and the call
// chain, leaf first, each frame "symbol (dso)" with its address.
type perfSample struct {
	comm   string
	frames []perfFrame
}

type perfFrame struct {
	ip       uint64
	sym, dso string
}

// profile samples packwire serve and the git processes it starts (perf
// follows children) over n full clones, and prints where the server's CPU
// went, per clone. git's binary is stripped, so its SHA-1 (collision
// detecting, the bulk of its own code in a verbatim clone) is found by
// address: the pages a profile of `git hash-object` spends its time in.
func profile(out string, t target, n int) {
	if _, err := exec.LookPath("perf"); err != nil {
		benchkit.Fatalf("-perf needs perf (apt-get install linux-perf)")
	}
	pid := 0
	for _, p := range t.server.Group.Procs() {
		if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p)); strings.TrimSpace(string(comm)) == "packwire" {
			pid = p
		}
	}
	if pid == 0 {
		benchkit.Fatalf("no packwire process in its group")
	}
	data := filepath.Join(out, "perf.data")
	rec := exec.Command("perf", "record", "-q", "-F", "1999", "-g", "-p", strconv.Itoa(pid), "-o", data)
	rec.Stderr = os.Stderr
	must(rec.Start())
	time.Sleep(time.Second) // perf attaches
	var s []sample
	for i := 0; i < n; i++ {
		s = append(s, clone(out, t, kinds[0]))
	}
	rec.Process.Signal(os.Interrupt)
	rec.Wait()
	perServer := median(s, cpuOf)
	samples := perfScript(data)
	sha1 := sha1Pages(out)

	counts, byProcess := map[string]int{}, map[string]int{}
	for _, smp := range samples {
		counts[classify(smp, sha1)]++
		byProcess[smp.comm]++
	}
	type row struct {
		what string
		n    int
	}
	var rows []row
	for what, c := range counts {
		rows = append(rows, row{what, c})
	}
	slices.SortFunc(rows, func(a, b row) int { return b.n - a.n })
	fmt.Printf("\nWhere the server CPU of a full clone of the maintained copy goes: perf (cpu-clock, 1999 Hz, call graphs) on packwire serve and the git it starts, over %d clones; %d samples, server CPU median %.3f s per clone (cgroup).\n\n",
		n, len(samples), perServer.Seconds())
	fmt.Println("| process | where | share | per clone |")
	fmt.Println("|---|---|---:|---:|")
	for _, r := range rows {
		share := float64(r.n) / float64(len(samples))
		if share < 0.01 {
			continue
		}
		proc, what, _ := strings.Cut(r.what, ": ")
		fmt.Printf("| %s | %s | %.1f%% | %.1f ms |\n", proc, what, 100*share, share*float64(perServer)/1e6)
	}
	var procs []string
	for comm, c := range byProcess {
		share := float64(c) / float64(len(samples))
		procs = append(procs, fmt.Sprintf("%s %.1f%% (%.1f ms)", comm, 100*share, share*float64(perServer)/1e6))
	}
	slices.Sort(procs)
	fmt.Printf("\nBy process: %s. Rows under 1%% left out; perf data in %s.\n", strings.Join(procs, ", "), data)
}

// classify names where one sample's time went.
func classify(s perfSample, sha1 map[uint64]bool) string {
	has := func(subs ...string) bool {
		for _, f := range s.frames {
			for _, sub := range subs {
				if strings.Contains(f.sym, sub) || strings.Contains(f.dso, sub) {
					return true
				}
			}
		}
		return false
	}
	if len(s.frames) == 0 {
		return s.comm + ": unknown"
	}
	leaf := s.frames[0]
	switch s.comm {
	case "packwire":
		switch {
		case has("gitexec.(*Runner).Run.func3") && has("sys_read", "os.(*File).Read"):
			return "packwire: relay git -> client: reading git's pipe"
		case has("gitexec.(*Runner).Run.func3"):
			return "packwire: relay git -> client: writing HTTP chunks to the socket"
		case has("gitexec", "compress/"):
			return "packwire: relay client -> git (request body, gzip)"
		case has("forkExec", "os.StartProcess", "os.(*Process).wait", "Wait4"):
			return "packwire: spawning and reaping git"
		case has("sqlite", "packwire/internal/governor", "database/sql"):
			return "packwire: governor records (SQLite)"
		case has("log/slog"):
			return "packwire: request log line"
		case has("packwire/internal/pipeline", "packwire/internal/access", "packwire/internal/protocol", "packwire/internal/store"):
			return "packwire: pipeline, access, classifier"
		case has("net/http"):
			return "packwire: HTTP serving (accept, headers, routing)"
		case has("gcBgMarkWorker", "gcDrain", "bgsweep", "bgscavenge", "mallocgc"):
			return "packwire: Go garbage collection and allocation"
		case has("runtime.sysmon"):
			return "packwire: Go runtime sysmon"
		case has("runtime.schedule", "runtime.findRunnable", "runtime.netpoll", "runtime.park_m", "runtime.mstart", "runtime.futex"):
			return "packwire: Go scheduler and netpoll (goroutine wake-ups)"
		}
		return "packwire: other"
	case "git":
		switch {
		case leaf.dso == "git" && sha1[leaf.ip>>12]:
			return "git: SHA-1 (the pack's checksum, sha1dc)"
		case has("execve", "_dl_", "ld-linux", "do_exit", "exit_mmap", "load_elf"):
			return "git: process start and exit (exec, dynamic loading, teardown)"
		case has("sys_write"):
			return "git: kernel, writing pipes (pack-objects -> upload-pack -> packwire)"
		case has("sys_read", "sys_pread"):
			return "git: kernel, reading pipes and files"
		case has("page_fault"):
			return "git: page faults (mapping packs, index, bitmap)"
		case leaf.dso == "git":
			return "git: other git code"
		case strings.HasPrefix(leaf.dso, "libz"):
			return "git: zlib"
		case strings.HasPrefix(leaf.dso, "libc"):
			return "git: libc"
		case leaf.dso == "[kernel.kallsyms]":
			return "git: other kernel (scheduling, syscalls)"
		}
		return "git: other"
	}
	return s.comm + ": all"
}

// perfScript reads a perf.data file's samples with their call chains.
func perfScript(data string) []perfSample {
	cmd := exec.Command("perf", "script", "-i", data, "-F", "comm,ip,sym,dso")
	stdout, err := cmd.StdoutPipe()
	must(err)
	must(cmd.Start())
	var samples []perfSample
	var cur *perfSample
	sc := bufio.NewScanner(stdout)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.TrimSpace(line) == "":
			cur = nil
		case !strings.HasPrefix(line, "\t") && !strings.HasPrefix(line, " "):
			samples = append(samples, perfSample{comm: strings.TrimSpace(line)})
			cur = &samples[len(samples)-1]
		case cur != nil:
			// "<ip> <symbol> (<dso>)"
			f := strings.TrimSpace(line)
			ipText, rest, _ := strings.Cut(f, " ")
			ip, _ := strconv.ParseUint(ipText, 16, 64)
			sym, dso := rest, ""
			if i := strings.LastIndex(rest, " ("); i >= 0 {
				sym, dso = rest[:i], strings.TrimSuffix(rest[i+2:], ")")
			}
			cur.frames = append(cur.frames, perfFrame{ip: ip, sym: sym, dso: filepath.Base(dso)})
		}
	}
	cmd.Wait()
	return samples
}

// sha1Pages returns the 4 KiB pages of git's binary where `git
// hash-object` of 32 MiB spends at least 2% of its samples: git's SHA-1.
func sha1Pages(out string) map[uint64]bool {
	file := filepath.Join(out, "sha1-probe.bin")
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 32<<20)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	must(os.WriteFile(file, buf, 0o644))
	data := filepath.Join(out, "sha1-probe.perf")
	if b, err := exec.Command("perf", "record", "-q", "-F", "1999", "-g", "-o", data, "git", "hash-object", "--no-filters", file).CombinedOutput(); err != nil {
		benchkit.Fatalf("perf record git hash-object: %v\n%s", err, b)
	}
	os.Remove(file)
	counts := map[uint64]int{}
	total := 0
	for _, s := range perfScript(data) {
		if len(s.frames) > 0 && s.frames[0].dso == "git" {
			counts[s.frames[0].ip>>12]++
			total++
		}
	}
	pages := map[uint64]bool{}
	for p, c := range counts {
		if c*50 >= total {
			pages[p] = true
		}
	}
	if len(pages) == 0 {
		benchkit.Fatalf("perf found no time in git's own code for git hash-object")
	}
	return pages
}
