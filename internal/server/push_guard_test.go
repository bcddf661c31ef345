package server

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"packwire/internal/governor"
	"packwire/internal/needs"
	"packwire/internal/pktline"
)

const zeroID = "0000000000000000000000000000000000000000"

// pushCommands frames ref commands as a client sends them: the first one
// carries caps, then a flush.
func pushCommands(caps string, cmds ...string) []byte {
	var b []byte
	for i, c := range cmds {
		if i == 0 {
			c += "\x00" + caps
		}
		b, _ = pktline.Append(b, []byte(c+"\n"))
	}
	return append(b, "0000"...)
}

// reportText unwraps a report-status answer (side-band or not) to its lines.
func reportText(t *testing.T, b []byte) string {
	t.Helper()
	var lines []string
	r := pktline.NewReader(bytes.NewReader(b))
	var inner []byte
	for {
		kind, p, err := r.Read()
		if err != nil || kind == pktline.Flush && len(inner) == 0 && len(lines) > 0 {
			break
		}
		if kind != pktline.Data {
			continue
		}
		if len(p) > 0 && p[0] == 1 { // side-band 1
			inner = append(inner, p[1:]...)
			continue
		}
		if len(p) > 0 && (p[0] == 2 || p[0] == 3) {
			continue
		}
		lines = append(lines, strings.TrimSuffix(string(p), "\n"))
	}
	if len(inner) > 0 {
		return reportText(t, inner)
	}
	return strings.Join(lines, "\n")
}

// rawHTTPPush POSTs body to the repository's git-receive-pack as who.
func (a *accessServer) rawHTTPPush(t *testing.T, who *actor, repo string, body []byte) string {
	t.Helper()
	req, _ := http.NewRequest("POST", fmt.Sprintf("http://%s/%s/git-receive-pack", a.HTTPAddr, repo), bytes.NewReader(body))
	req.SetBasicAuth(who.name, who.token)
	req.Header.Set("Content-Type", "application/x-git-receive-pack-request")
	client := &http.Client{Timeout: 30 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("raw HTTP push: %s: %s", resp.Status, out)
	}
	return reportText(t, out)
}

// sshSession opens an exec session as who, after the advertisement.
func (a *accessServer) sshSession(t *testing.T, who *actor, command string) (*gossh.Session, io.WriteCloser, io.Reader, func()) {
	t.Helper()
	sess, stdin, stdout, _, done := sshExecWith(t, a.SSHAddr.String(), who.key, "", command)
	return sess, stdin, stdout, done
}

// rawSSHPush sends body after reading the advertisement and reads the
// report without ever closing its side, as dulwich, libgit2 and JGit do:
// the report must come once the pack has ended, not at EOF.
func (a *accessServer) rawSSHPush(t *testing.T, who *actor, repo string, body []byte) string {
	t.Helper()
	_, stdin, stdout, done := a.sshSession(t, who, "git-receive-pack '"+repo+"'")
	defer done()
	r := pktline.NewReader(stdout)
	for { // the advertisement
		kind, _, err := r.Read()
		if err != nil {
			t.Fatalf("advertisement: %v", err)
		}
		if kind == pktline.Flush {
			break
		}
	}
	if _, err := stdin.Write(body); err != nil {
		t.Fatal(err)
	}
	got := make(chan []byte, 1)
	go func() {
		var out bytes.Buffer
		for { // up to the report's end, never to EOF
			kind, p, err := r.Read()
			if err != nil {
				break
			}
			if kind == pktline.Flush {
				out.WriteString("0000")
				if strings.Contains(out.String(), "unpack") {
					break
				}
				continue
			}
			b, _ := pktline.Append(nil, p)
			out.Write(b)
		}
		got <- out.Bytes()
	}()
	select {
	case b := <-got:
		return reportText(t, b)
	case <-time.After(20 * time.Second):
		t.Fatal("no report within 20s while the client kept its side open")
		return ""
	}
}

func (a *accessServer) rawPush(t *testing.T, transport string, who *actor, repo string, body []byte) string {
	if transport == "ssh" {
		return a.rawSSHPush(t, who, repo, body)
	}
	return a.rawHTTPPush(t, who, repo, body)
}

// emptyPack is a pack with no objects, as git sends for a push that needs none.
func emptyPack(t *testing.T) []byte {
	cmd := exec.Command("git", "pack-objects", "--stdout")
	cmd.Stdin = strings.NewReader("")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestZeroToZeroCommand: "0000... 0000... refs/heads/main" from a writer
// over raw pkt-lines is refused with a reason and logged; main stays, so
// the two-step delete-then-recreate force-push of a protected ref fails.
func TestZeroToZeroCommand(t *testing.T) {
	t.Parallel()
	for _, transport := range pushTransports {
		t.Run(transport, func(t *testing.T) {
			s := startAccessServer(t)
			bare := s.seed(t, "team/app")
			s.grant(t, "alice", "write", "**")
			s.protect(t, "**", "refs/heads/main")
			before := refOf(s, bare, "refs/heads/main")
			body := pushCommands("report-status side-band-64k", zeroID+" "+zeroID+" refs/heads/main")
			body = append(body, emptyPack(t)...)
			report := s.rawPush(t, transport, s.alice, "team/app", body)
			if !strings.Contains(report, "ng refs/heads/main invalid command: old and new object ids are both zero") {
				t.Fatalf("zero-to-zero command not refused; report:\n%s", report)
			}
			if got := refOf(s, bare, "refs/heads/main"); got != before {
				t.Fatalf("main changed: %q -> %q", before, got)
			}
			if countLogLines(s.logs.String(), `msg="ref refused"`, "ref=refs/heads/main", "both zero") != 1 {
				t.Fatalf("refusal not logged:\n%s", lastLines(s.logs.String(), 10))
			}
			// A delete with the real old id is still refused by the rule.
			body = pushCommands("report-status", before+" "+zeroID+" refs/heads/main")
			if report := s.rawPush(t, transport, s.alice, "team/app", body); !strings.Contains(report, "ng refs/heads/main protected: delete denied") {
				t.Fatalf("delete of protected main: %s", report)
			}
			if got := refOf(s, bare, "refs/heads/main"); got != before {
				t.Fatalf("main deleted")
			}
		})
	}
}

// TestForceDeniedEveryNamespace: force-push protection holds for tags and
// for refs outside refs/heads/ (where git's receive.denyNonFastForwards
// does not look), fast-forwards there still go through, and a push that
// mixes a force-allowed forced update with a force-denied ref writes the
// first and refuses only the second.
func TestForceDeniedEveryNamespace(t *testing.T) {
	t.Parallel()
	for _, transport := range pushTransports {
		t.Run(transport, func(t *testing.T) {
			s := startAccessServer(t)
			bare := s.seed(t, "team/app")
			s.grant(t, "alice", "write", "**")
			s.protect(t, "**", "refs/tags/*")
			s.protect(t, "**", "refs/meta/*")
			w := s.work(t, bare)
			base := s.commit(w, "base")
			if out, err := s.git(t, w, transport, s.alice, "team/app", "push", "URL", "HEAD:refs/meta/config", "HEAD:refs/tags/v9", "HEAD:refs/heads/feature"); err != nil {
				t.Fatalf("create: %v\n%s", err, out)
			}
			// A fast-forward of a protected ref outside refs/heads/ goes through.
			next := s.commit(w, "next")
			if out, err := s.git(t, w, transport, s.alice, "team/app", "push", "URL", "HEAD:refs/meta/config"); err != nil {
				t.Fatalf("fast-forward of refs/meta/config: %v\n%s", err, out)
			}
			// Rewritten history: forced pushes of the tag and refs/meta/config are
			// refused, the unprotected feature branch is forced in the same push.
			s.env.Git(w, "reset", "-q", "--hard", base+"~1")
			forced := s.commit(w, "rewrite")
			out, err := s.git(t, w, transport, s.alice, "team/app", "push", "--force", "URL",
				"HEAD:refs/meta/config", "HEAD:refs/tags/v9", "HEAD:refs/heads/feature")
			if err == nil {
				t.Fatalf("forced push of protected refs succeeded:\n%s", out)
			}
			for _, want := range []string{"HEAD -> refs/meta/config (protected: force-push denied)", "HEAD -> v9 (protected: force-push denied)", "HEAD -> feature (forced update)"} {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			if refOf(s, bare, "refs/meta/config") != next || refOf(s, bare, "refs/tags/v9") != base || refOf(s, bare, "refs/heads/feature") != forced {
				t.Fatalf("wrong refs after the forced push:\n%s", s.env.Git(bare, "show-ref"))
			}
			if n := countLogLines(s.logs.String(), `msg="ref refused"`, "op=force-push", `decided_by="rule`); n != 2 {
				t.Errorf("%d force-push refusals logged with their rule, want 2", n)
			}
			s.env.Fsck(bare)

			// Atomic: the hook's refusal of one ref writes nothing, creates included.
			out, err = s.git(t, w, transport, s.alice, "team/app", "push", "--atomic", "--force", "URL",
				"HEAD:refs/meta/config", "HEAD:refs/heads/brand-new")
			if err == nil || !strings.Contains(out, "protected: force-push denied") {
				t.Fatalf("atomic push with a refused force: %v\n%s", err, out)
			}
			if refOf(s, bare, "refs/heads/brand-new") != "" || refOf(s, bare, "refs/meta/config") != next {
				t.Fatalf("atomic push wrote refs:\n%s", s.env.Git(bare, "show-ref"))
			}
			// An annotated tag moved to a descendant commit is still a rewrite of
			// the tag: refused.
			s.env.Git(w, "reset", "-q", "--hard", next)
			s.commit(w, "after")
			s.env.Git(w, "tag", "-f", "-a", "-m", "moved", "v9")
			if out, err := s.git(t, w, transport, s.alice, "team/app", "push", "--force", "URL", "refs/tags/v9"); err == nil || !strings.Contains(out, "protected: force-push denied") {
				t.Fatalf("moving a protected tag: %v\n%s", err, out)
			}
			s.env.Fsck(bare)
		})
	}
}

// TestRefusedPushEndsAtPackTrailer: a push whose every ref is refused is
// answered once its pack has ended, while the client keeps its side open
// (over SSH), instead of waiting for EOF until the idle timeout.
func TestRefusedPushEndsAtPackTrailer(t *testing.T) {
	t.Parallel()
	for _, transport := range pushTransports {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			s := startAccessServer(t)
			bare := s.seed(t, "team/app")
			s.grant(t, "alice", "write", "**")
			s.rule(t, false, "create", "**", "refs/tags/**", "*")
			w := s.work(t, bare)
			head := s.commit(w, "new work")
			// A real pack with the new commit (and its tree and blob), deltas allowed.
			cmd := exec.Command("git", "pack-objects", "--stdout", "--revs", "--thin")
			cmd.Dir = w
			cmd.Stdin = strings.NewReader(head + "\n^" + head + "~1\n")
			pack, err := cmd.Output()
			if err != nil {
				t.Fatal(err)
			}
			body := pushCommands("report-status side-band-64k", zeroID+" "+head+" refs/tags/new1", zeroID+" "+head+" refs/tags/new2")
			body = append(body, pack...)
			start := time.Now()
			report := s.rawPush(t, transport, s.alice, "team/app", body)
			if !strings.Contains(report, "unpack ok") || strings.Count(report, "protected: create denied") != 2 {
				t.Fatalf("report:\n%s", report)
			}
			// Waiting for EOF lasts the idle timeout (10 min); 2 min is a loaded machine.
			if d := time.Since(start); d > 2*time.Minute {
				t.Fatalf("refused push answered after %v", d)
			}
			// A malformed pack is reported as git would ("unpack ..."), still without EOF.
			bad := append(pushCommands("report-status", zeroID+" "+head+" refs/tags/new3"), "PACK\x00\x00\x00\x02\x00\x00\x00\x01\x50"...)
			if report := s.rawPush(t, transport, s.alice, "team/app", bad); !strings.Contains(report, "unpack bad pack") {
				t.Fatalf("bad pack report:\n%s", report)
			}
		})
	}
}

// TestDulwichRefusedPush: dulwich, a second git implementation, gets the
// refusal of an all-refused SSH push at once (it waited for the idle
// timeout before: it keeps the channel open until the report).
func TestDulwichRefusedPush(t *testing.T) {
	t.Parallel()
	python := "/usr/bin/python3"
	if out, err := exec.Command(python, "-c", "import dulwich").CombinedOutput(); err != nil {
		needs.Missing(t, "dulwich is not installed (Debian python3-dulwich; scripts/install-deps installs it): %v\n%s", err, out)
	}
	s := startAccessServer(t)
	bare := s.seed(t, "team/app")
	s.grant(t, "alice", "write", "**")
	s.rule(t, false, "create", "**", "refs/tags/**", "*")
	w := s.work(t, bare)
	s.commit(w, "for dulwich")
	url, env := s.remote("ssh", s.alice, "team/app")
	script := `
import sys
from dulwich import porcelain
try:
    porcelain.push(sys.argv[1], sys.argv[2], [b"HEAD:refs/tags/from-dulwich"], errstream=sys.stderr.buffer)
except Exception as e:
    print("push failed: %s: %s" % (type(e).__name__, e))
`
	cmd := exec.Command(python, "-c", script, w, url)
	cmd.Env = append(os.Environ(), env...)
	cmd.Env = append(cmd.Env, "HOME="+s.env.Home)
	start := time.Now()
	done := make(chan []byte, 1)
	go func() { out, _ := cmd.CombinedOutput(); done <- out }()
	select {
	case out := <-done:
		if !strings.Contains(string(out), "protected: create denied") {
			t.Fatalf("dulwich did not get the refusal:\n%s", out)
		}
		// Waiting for EOF lasts the idle timeout (10 min); 2 min is a loaded machine.
		if d := time.Since(start); d > 2*time.Minute {
			t.Fatalf("dulwich got the refusal after %v", d)
		}
	case <-time.After(3 * time.Minute):
		cmd.Process.Kill()
		t.Fatal("dulwich push hung")
	}
	if refOf(s, bare, "refs/tags/from-dulwich") != "" {
		t.Fatal("tag written")
	}
}

// refCommands frames n create commands of refs/tags/t0..., the first with
// report-status.
func refCommands(head string, n int) []byte {
	var body bytes.Buffer
	for i := 0; i < n; i++ {
		line := fmt.Sprintf("%s %s refs/tags/t%d\n", zeroID, head, i)
		if i == 0 {
			line = strings.TrimSuffix(line, "\n") + "\x00report-status\n"
		}
		b, _ := pktline.Append(nil, []byte(line))
		body.Write(b)
	}
	body.WriteString("0000")
	return body.Bytes()
}

// TestPushRefBound: a push with more ref updates than --max-push-refs is
// refused as it is read, with a message; a flood of a million refused
// commands costs the server no more memory than the bound allows (it took
// 736 MB before); pushes within the bound still work.
func TestPushRefBound(t *testing.T) {
	s := startAccessServer(t)
	bare := s.seed(t, "team/app")
	s.grant(t, "alice", "write", "**")
	s.rule(t, false, "create", "**", "refs/tags/**", "*")
	head := refOf(s, bare, "refs/heads/main")
	post := func(body []byte) net.Conn {
		conn := rawHTTP(t, s.HTTPAddr.String(), "POST", "/team/app/git-receive-pack",
			"Authorization: Basic "+basicAuth("alice", s.alice.token),
			"Content-Type: application/x-git-receive-pack-request", fmt.Sprintf("Content-Length: %d", len(body)))
		go conn.Write(body) // the server may stop reading it
		return conn
	}

	// One command over a bound of 1,000: refused with the reason.
	s.Pipeline.MaxPushRefs = 1000
	status, text, err := response(post(refCommands(head, 1001)), 30*time.Second)
	if err != nil || status != 400 || !strings.Contains(text, "too many ref updates in one push (max 1000)") {
		t.Fatalf("oversized push: %d %q %v", status, text, err)
	}

	// A million commands (94 MB) against the default bound: the server's
	// heap stays within what 100,000 held commands need.
	s.Pipeline.MaxPushRefs = 0
	flood := refCommands(head, 1_000_000) // built before the baseline: the test's own bytes
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var peak atomic.Uint64
	done := make(chan struct{})
	go func() {
		var m runtime.MemStats
		for {
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
			runtime.ReadMemStats(&m)
			if m.HeapInuse > peak.Load() {
				peak.Store(m.HeapInuse)
			}
		}
	}()
	conn := post(flood)
	conn.SetReadDeadline(time.Now().Add(60 * time.Second))
	io.ReadAll(conn) // the answer, or a reset: refused either way
	close(done)
	grew := int64(peak.Load()) - int64(before.HeapInuse)
	t.Logf("heap grew by %d MB during a push of a million commands", grew>>20)
	if grew > 200<<20 {
		t.Fatalf("heap grew by %d MB", grew>>20)
	}
	if refOf(s, bare, "refs/tags/t0") != "" {
		t.Fatal("a tag was written")
	}

	// Within the bound, a real push goes through.
	w := s.work(t, bare)
	s.commit(w, "fits")
	if out, err := s.git(t, w, "http", s.alice, "team/app", "push", "URL", "HEAD:refs/heads/main"); err != nil {
		t.Fatalf("normal push: %v\n%s", err, out)
	}
}

// TestPushOutcomeRecorded: the governor records a push whose pack git
// could not take as a git error (receive-pack exits 0 and says so only in
// its report), and a push whose refs were all refused as refused.
func TestPushOutcomeRecorded(t *testing.T) {
	t.Parallel()
	s := startAccessServer(t)
	bare := s.seed(t, "team/app")
	s.grant(t, "alice", "write", "**")
	s.rule(t, false, "create", "**", "refs/tags/**", "*")
	head := refOf(s, bare, "refs/heads/main")
	seq := s.lastSeq(t)
	// A new commit whose pack is cut short: receive-pack's unpack fails.
	w := s.work(t, bare)
	next := s.commit(w, "truncated")
	cmd := exec.Command("git", "pack-objects", "--stdout", "--revs")
	cmd.Dir = w
	cmd.Stdin = strings.NewReader(next + "\n^" + head + "\n")
	pack, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	body := append(pushCommands("report-status", head+" "+next+" refs/heads/main"), pack[:len(pack)-30]...)
	if report := s.rawHTTPPush(t, s.alice, "team/app", body); !strings.Contains(report, "unpack") || strings.Contains(report, "unpack ok") {
		t.Fatalf("truncated pack report:\n%s", report)
	}
	body = pushCommands("report-status", zeroID+" "+head+" refs/tags/x")
	body = append(body, emptyPack(t)...)
	s.rawHTTPPush(t, s.alice, "team/app", body)
	recs := s.recordsAfter(t, seq, func(r []governor.Record) bool { return len(pushRecords(r)) >= 2 })
	pushes := pushRecords(recs)
	if pushes[0].Result != governor.ResultGitError || !strings.Contains(pushes[0].Error, "unpack") {
		t.Errorf("truncated pack recorded as %s (%q), want git-error", pushes[0].Result, pushes[0].Error)
	}
	if pushes[1].Result != governor.ResultRefused {
		t.Errorf("all-refused push recorded as %s, want refused", pushes[1].Result)
	}
	if refOf(s, bare, "refs/heads/main") != head {
		t.Fatal("main moved")
	}
	s.env.Fsck(bare)
}

func pushRecords(recs []governor.Record) []governor.Record {
	var out []governor.Record
	for _, r := range recs {
		if r.Kind == "push" {
			out = append(out, r)
		}
	}
	return out
}

// TestProtectedTagMove: with refs/tags/** protected, a writer cannot move
// an existing tag, even to a descendant of its commit (a fast-forward by
// ancestry, which the old server let through as "forced update"), alone
// or in an --atomic push; an admin still may.
func TestProtectedTagMove(t *testing.T) {
	t.Parallel()
	for _, transport := range pushTransports {
		t.Run(transport, func(t *testing.T) {
			s := startAccessServer(t)
			bare := s.seed(t, "team/app")
			s.grant(t, "alice", "write", "**")
			carol := s.addUser(t, "carol")
			s.grant(t, "carol", "admin", "**")
			s.protect(t, "**", "refs/tags/**")
			w := s.work(t, bare)
			old := s.env.RevParse(w, "HEAD~3")
			s.env.Git(w, "tag", "release-1", old)
			if out, err := s.git(t, w, transport, s.alice, "team/app", "push", "URL", "release-1"); err != nil {
				t.Fatalf("push of a new tag: %v\n%s", err, out)
			}
			head := s.env.RevParse(w, "HEAD")
			s.env.Git(w, "tag", "-f", "release-1", head)
			out, err := s.git(t, w, transport, s.alice, "team/app", "push", "--force", "URL", "release-1")
			if err == nil || !strings.Contains(out, "release-1 -> release-1 (protected: force-push denied)") {
				t.Fatalf("writer moved a protected tag forward: %v\n%s", err, out)
			}
			if got := refOf(s, bare, "refs/tags/release-1"); got != old {
				t.Fatalf("release-1 moved to %s", got)
			}
			if countLogLines(s.logs.String(), `msg="ref refused"`, "ref=refs/tags/release-1", "op=force-push", `decided_by="rule`) != 1 {
				t.Errorf("refusal not logged with its rule:\n%s", lastLines(s.logs.String(), 10))
			}
			// Atomic, with a new branch: nothing is written.
			out, err = s.git(t, w, transport, s.alice, "team/app", "push", "--atomic", "--force", "URL", "release-1", "HEAD:refs/heads/other")
			if err == nil || !strings.Contains(out, "protected: force-push denied") {
				t.Fatalf("atomic push moving a protected tag: %v\n%s", err, out)
			}
			if refOf(s, bare, "refs/tags/release-1") != old || refOf(s, bare, "refs/heads/other") != "" {
				t.Fatalf("atomic push wrote refs:\n%s", s.env.Git(bare, "show-ref"))
			}
			// A branch is still judged by ancestry: a fast-forward of a
			// protected branch goes through.
			s.protect(t, "**", "refs/heads/main")
			s.commit(w, "next")
			if out, err := s.git(t, w, transport, s.alice, "team/app", "push", "URL", "HEAD:refs/heads/main"); err != nil {
				t.Fatalf("fast-forward of protected main: %v\n%s", err, out)
			}
			// An admin may move the tag.
			if out, err := s.git(t, w, transport, carol, "team/app", "push", "--force", "URL", "release-1"); err != nil {
				t.Fatalf("admin moving the tag: %v\n%s", err, out)
			}
			if got := refOf(s, bare, "refs/tags/release-1"); got != head {
				t.Fatalf("admin's move not written: release-1 at %s, want %s", got, head)
			}
			s.env.Fsck(bare)
		})
	}
}
