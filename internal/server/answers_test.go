package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"packwire/internal/access"
	"packwire/internal/gittest"
	"packwire/internal/governor"
	"packwire/internal/pktline"
	"packwire/internal/store"
)

// lsRemoteRuns runs ls-remote with the case's protocol and returns the
// refs it printed and how many of the requests it made ran git (a
// record with a peak RSS: answers from the answer cache have none).
func (s *testServer) lsRemoteRuns(t *testing.T, tc transportCase, url string) (refs string, ran int) {
	t.Helper()
	seq := s.lastSeq(t)
	out, err := s.env.Run("", append(protocolEnv(tc.version), tc.env...), "ls-remote", url)
	if err != nil {
		t.Fatalf("%s: ls-remote: %v\n%s", tc.name, err, lastLines(out, 30))
	}
	assertProtocol(t, out, tc.version)
	want := 1 // a git:// or SSH session
	if strings.HasPrefix(tc.name, "http") {
		want = tc.version // v0: GET info/refs; v2: GET and POST ls-refs
		if tc.version == 0 {
			want = 1
		}
	}
	served := func(recs []governor.Record) []governor.Record {
		return slices.DeleteFunc(slices.Clone(recs), func(r governor.Record) bool { return r.Result == governor.ResultChallenged })
	}
	recs := served(s.recordsAfter(t, seq, func(r []governor.Record) bool { return len(served(r)) >= want }))
	for _, r := range recs {
		if r.Result != governor.ResultOK {
			t.Fatalf("%s: ls-remote record %+v", tc.name, r)
		}
		if r.MaxRSS > 0 {
			ran++
		}
	}
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) == 2 && len(f[0]) == 40 && !strings.Contains(l, "packet:") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n"), ran
}

// TestAnswersCachedEveryTransport: with the real git client over git://
// and SSH (protocol v2) and HTTP (v0 and v2), a second ls-remote of
// unchanged refs runs no git (advertisement and ls-refs from the answer
// cache) and prints the same refs; a push is visible to the very next
// ls-remote, racy or not; hidden refs (packwire's and the repository's
// own transfer.hideRefs, set after answers were kept) are never shown; a
// clone and a fetch from cached answers are whole. git:// and SSH v0 still
// work (their sessions run git).
func TestAnswersCachedEveryTransport(t *testing.T) {
	t.Parallel()
	enableSSH, sshEnvFor := withSSH(t)
	s := startServer(t, enableSSH)
	sshEnv := sshEnvFor(s)
	for _, tc := range transportCases(s, sshEnv) {
		t.Run(tc.name, func(t *testing.T) {
			name := "answers/" + tc.name
			bare := s.seed(t, name)
			url := tc.url(name)
			cached := tc.version == 2 || strings.HasPrefix(tc.name, "http")
			settle(t, bare)
			first, _ := s.lsRemoteRuns(t, tc, url)
			second, ran := s.lsRemoteRuns(t, tc, url)
			if second != first || !strings.Contains(first, "refs/heads/main") {
				t.Fatalf("second ls-remote printed\n%s\nfirst\n%s", second, first)
			}
			if cached && ran != 0 || !cached && ran == 0 {
				t.Fatalf("second ls-remote: %d requests ran git (answers cached: %v)", ran, cached)
			}

			// A push is seen at once (the stamp is racy: git runs), and
			// again once the state settled (a new stamp).
			head := pushCommit(t, s, name, "pushed.txt")
			for _, when := range []string{"right after the push", "after the push settled", "from the cache after the push"} {
				refs, ran := s.lsRemoteRuns(t, tc, url)
				if !strings.Contains(refs, head+"\trefs/heads/main") {
					t.Fatalf("%s: ls-remote does not show main at %s:\n%s", when, head, refs)
				}
				if when == "from the cache after the push" && cached && ran != 0 {
					t.Fatalf("%s: %d requests ran git", when, ran)
				}
				settle(t, bare)
			}

			// Hidden refs: packwire's own namespace, and a hideRefs setting
			// made after answers were kept (the config is in the stamp).
			s.env.Git(bare, "update-ref", "refs/packwire/internal", head)
			s.env.Git(bare, "update-ref", "refs/heads/secret", head)
			settle(t, bare)
			refs, _ := s.lsRemoteRuns(t, tc, url)
			if !strings.Contains(refs, "refs/heads/secret") || strings.Contains(refs, "refs/packwire/") {
				t.Fatalf("before hideRefs:\n%s", refs)
			}
			s.lsRemoteRuns(t, tc, url) // kept
			s.env.Git(bare, "config", "transfer.hideRefs", "refs/heads/secret")
			settle(t, bare)
			for i := 0; i < 2; i++ {
				refs, ran := s.lsRemoteRuns(t, tc, url)
				if strings.Contains(refs, "refs/heads/secret") || strings.Contains(refs, "refs/packwire/") {
					t.Fatalf("ls-remote %d after hideRefs shows a hidden ref:\n%s", i, refs)
				}
				if i == 1 && cached && ran != 0 {
					t.Fatalf("second ls-remote after hideRefs: %d requests ran git", ran)
				}
			}

			// Clone and fetch through cached answers.
			dir := filepath.Join(t.TempDir(), "c")
			tc.run(t, s, "", "clone", "-q", url, dir)
			s.env.Fsck(dir)
			head = pushCommit(t, s, name, "again.txt")
			settle(t, bare)
			s.lsRemoteRuns(t, tc, url) // the answers for the new refs are kept
			tc.run(t, s, dir, "fetch", "-q", "origin")
			if got := s.env.RevParse(dir, "origin/main"); got != head {
				t.Fatalf("fetch after a push has origin/main at %s, want %s", got, head)
			}
			s.env.Fsck(dir)
		})
	}
}

// TestAnswersPerPrincipal: an answer kept for one principal is never
// given to another. packwire hides no refs per principal today (access
// decides per repository; hidden refs are git's config, in the key), but
// an answer is keyed on the principal all the same, so that a rule that
// one day hides refs per principal cannot leak them through the cache.
// Over SSH v2 and HTTP v2 (anonymous read off, so that git sends its
// token): alice's second ls-remote is answered from the cache, bob's first
// runs git.
func TestAnswersPerPrincipal(t *testing.T) {
	t.Parallel()
	enableSSH, sshEnvFor := withSSH(t)
	s := startServer(t, enableSSH)
	aliceSSH := sshEnvFor(s)
	ctx := context.Background()
	if err := s.Data.Store.SetSetting(ctx, access.SettingAnonRead, "off"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Data.Store.AddUser(ctx, "bob"); err != nil {
		t.Fatal(err)
	}
	if err := s.Data.Store.SetGrant(ctx, store.Grant{User: "bob", RepoPattern: "**", Role: "read"}); err != nil {
		t.Fatal(err)
	}
	bobToken, err := s.Data.Access.CreateToken(ctx, "bob", 0)
	if err != nil {
		t.Fatal(err)
	}
	bobKey := s.env.NewSSHKey("bob")
	text, err := os.ReadFile(bobKey + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	pub, _, _, _, err := gossh.ParseAuthorizedKey(text)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Data.Store.AddKey(ctx, "bob", store.Key{Fingerprint: gossh.FingerprintSHA256(pub), PublicKey: string(text)}); err != nil {
		t.Fatal(err)
	}
	bobSSH := []string{gittest.SSHCommandEnv(bobKey)}
	for _, tr := range []string{"ssh", "http"} {
		t.Run(tr, func(t *testing.T) {
			name := "principals-" + tr // a repository per transport: no answer kept yet
			bare := s.seed(t, name)
			settle(t, bare)
			tc := transportCase{name: tr + "-v2", version: 2}
			alice, bob := tc, tc
			aliceURL, bobURL := s.pushURL(name), fmt.Sprintf("http://bob:%s@%s/%s", bobToken, s.HTTPAddr, name)
			if tr == "ssh" {
				alice.env, bob.env = aliceSSH, bobSSH
				aliceURL, bobURL = s.sshURL(name), s.sshURL(name)
			}
			aliceRefs, _ := s.lsRemoteRuns(t, alice, aliceURL)
			if _, ran := s.lsRemoteRuns(t, alice, aliceURL); ran != 0 {
				t.Fatalf("alice's second ls-remote ran git %d times", ran)
			}
			bobRefs, ran := s.lsRemoteRuns(t, bob, bobURL)
			if ran == 0 {
				t.Fatal("bob's first ls-remote ran no git: it got alice's answer")
			}
			if bobRefs != aliceRefs {
				t.Fatalf("bob sees\n%s\nalice\n%s", bobRefs, aliceRefs)
			}
			recs := s.recordsAfter(t, 0, func([]governor.Record) bool { return true })
			for _, r := range recs[len(recs)-1:] {
				if r.User != "bob" {
					t.Fatalf("the last record is %q's, want bob's (git did not authenticate)", r.User)
				}
			}
		})
	}
}

// TestAnswersHerd: 8 ls-remotes over git:// v2 at once, after a push,
// run one git between them (the others wait for its answer), and all
// print the pushed commit.
func TestAnswersHerd(t *testing.T) {
	s := startServer(t, nil)
	bare := s.seed(t, "herd")
	tc := transportCase{name: "git-v2", version: 2}
	s.lsRemoteRuns(t, tc, s.gitURL("herd")) // the capabilities are kept
	head := pushCommit(t, s, "herd", "herd.txt")
	settle(t, bare)
	seq := s.lastSeq(t)
	const n = 8
	var wg sync.WaitGroup
	outs := make([]string, n)
	for i := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := s.env.Run("", protocolEnv(2), "ls-remote", s.gitURL("herd"))
			if err != nil {
				t.Errorf("ls-remote: %v\n%s", err, out)
			}
			outs[i] = out
		}()
	}
	wg.Wait()
	recs := s.recordsAfter(t, seq, func(r []governor.Record) bool { return len(r) >= n })
	ran := 0
	for _, r := range recs {
		if r.MaxRSS > 0 {
			ran++
		}
	}
	if ran != 1 {
		t.Fatalf("%d of %d concurrent ls-remotes ran git, want 1", ran, n)
	}
	for _, out := range outs {
		assertProtocol(t, out, 2)
		if !strings.Contains(out, head+"\trefs/heads/main") {
			t.Fatalf("ls-remote misses the push:\n%s", lastLines(out, 10))
		}
	}
}

// v2Command frames a v2 command: "|" is a delimiter.
func v2Command(lines ...string) []byte {
	var b bytes.Buffer
	for _, l := range lines {
		if l == "|" {
			b.WriteString("0001")
			continue
		}
		pktline.Write(&b, []byte(l+"\n"))
	}
	pktline.WriteFlush(&b)
	return b.Bytes()
}

// readSection reads one answer of a v2 session: packets to a flush.
func readSection(t *testing.T, r io.Reader) []byte {
	t.Helper()
	var out bytes.Buffer
	pr := pktline.NewReader(io.TeeReader(r, &out))
	for {
		kind, _, err := pr.Read()
		if err != nil {
			t.Fatalf("reading an answer: %v (so far %q)", err, out.Bytes())
		}
		if kind == pktline.Flush {
			return out.Bytes()
		}
	}
}

// TestV2SessionWithoutGit drives a git:// v2 session by hand: the same
// ls-refs twice in one session gets the same bytes; a client that hangs
// up in the middle of a kept ls-refs answer leaves the next one whole; a
// fetch command larger than the in-memory bound (25,000 haves) is served;
// a flush ends a session. (The idle timeout: TestV2SessionIdleEnds.)
func TestV2SessionWithoutGit(t *testing.T) {
	t.Parallel()
	// 30 s idle: with 2 s (and 5 s) the server ended the session while it
	// made the large fetch's answer on a loaded machine ("fetch answer:
	// EOF", at load averages of 20 to 50 on 2 cores).
	s := startServer(t, func(c *Config) { c.IdleTimeout = 30 * time.Second })
	bare := s.seed(t, "session")
	// Many refs: an answer of a few hundred KiB, not sent in one write.
	var refs strings.Builder
	head := s.env.RevParse(bare, "main")
	for i := 0; i < 3000; i++ {
		fmt.Fprintf(&refs, "create refs/heads/branch-with-a-long-name-%05d %s\n", i, head)
	}
	update := exec.Command("git", "update-ref", "--stdin")
	update.Dir, update.Env, update.Stdin = bare, s.env.Vars, strings.NewReader(refs.String())
	if out, err := update.CombinedOutput(); err != nil {
		t.Fatalf("update-ref: %v %s", err, out)
	}
	settle(t, bare)
	lsRefs := v2Command("command=ls-refs", "agent=raw", "object-format=sha1", "|", "peel", "symrefs", "ref-prefix refs/heads/")

	sess := dialUploadPack(t, s, "session", true)
	caps := sess.advertisement(t)
	if !slices.Contains(caps, "version 2") || !slices.Contains(caps, "object-format=sha1") {
		t.Fatalf("capabilities: %q", caps)
	}
	sess.conn.Write(lsRefs)
	first := readSection(t, sess.r)
	sess.conn.Write(lsRefs)
	if second := readSection(t, sess.r); !bytes.Equal(first, second) {
		t.Fatalf("the same ls-refs twice in a session: %d and %d bytes", len(first), len(second))
	}
	if len(first) < 200<<10 || !bytes.Contains(first, []byte("refs/heads/branch-with-a-long-name-02999")) {
		t.Fatalf("ls-refs answer of %d bytes", len(first))
	}

	// A large fetch command: its haves (objects the server lacks) do not
	// fit the in-memory bound.
	var fetch []string
	fetch = append(fetch, "command=fetch", "agent=raw", "object-format=sha1", "|", "ofs-delta", "no-progress", "want "+head)
	for i := 0; i < 25000; i++ {
		fetch = append(fetch, fmt.Sprintf("have %040x", i+1))
	}
	fetch = append(fetch, "done")
	go sess.conn.Write(v2Command(fetch...))
	answer := fetchAnswerV2(t, sess.r)
	if n := indexPack(t, s, answerPack(t, answer, true)); n == 0 {
		t.Fatal("the large fetch's pack is empty")
	}
	pktline.WriteFlush(sess.conn) // ends the session
	sess.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if rest, err := io.ReadAll(sess.r); err != nil || len(rest) != 0 {
		t.Fatalf("after the flush: %q, %v (want the session closed)", rest, err)
	}

	// Hang up in the middle of a kept answer; the next client gets it whole.
	hang := dialUploadPack(t, s, "session", true)
	hang.advertisement(t)
	hang.conn.Write(lsRefs)
	io.ReadFull(hang.r, make([]byte, 1000))
	hang.conn.(*net.TCPConn).SetLinger(0)
	hang.conn.Close()
	next := dialUploadPack(t, s, "session", true)
	next.advertisement(t)
	next.conn.Write(lsRefs)
	if again := readSection(t, next.r); !bytes.Equal(again, first) {
		t.Fatalf("after a client hung up mid-answer: %d bytes, want %d", len(again), len(first))
	}
}

// TestV2SessionIdleEnds: a git:// v2 session idle past the idle timeout is
// ended by the server, not before. Its own server with a short timeout, so
// that the test does not wait out TestV2SessionWithoutGit's 30 s.
func TestV2SessionIdleEnds(t *testing.T) {
	t.Parallel()
	const idle = 3 * time.Second
	s := startServer(t, func(c *Config) { c.IdleTimeout = idle })
	s.seed(t, "session")
	sess := dialUploadPack(t, s, "session", true)
	sess.advertisement(t)
	sess.conn.Write(v2Command("command=ls-refs", "agent=raw", "object-format=sha1", "|", "ref-prefix refs/heads/"))
	if answer := readSection(t, sess.r); !bytes.Contains(answer, []byte("refs/heads/main")) {
		t.Fatalf("ls-refs: %q", answer)
	}
	// The server's clock started when it had sent the answer, a little
	// before this one: the lower bound leaves it a second.
	start := time.Now()
	sess.conn.SetReadDeadline(time.Now().Add(90 * time.Second))
	if rest, err := io.ReadAll(sess.r); err != nil || len(rest) != 0 {
		t.Fatalf("idle session: %q, %v (want closed by the server)", rest, err)
	}
	if waited := time.Since(start); waited < idle-time.Second || waited > 80*time.Second {
		t.Fatalf("idle session closed after %s, idle timeout %s", waited, idle)
	}
}

// fetchAnswerV2 reads a v2 fetch answer to the flush after its pack.
func fetchAnswerV2(t *testing.T, r io.Reader) []byte {
	t.Helper()
	var answer bytes.Buffer
	pr := pktline.NewReader(io.TeeReader(r, &answer))
	inPack := false
	for {
		kind, line, err := pr.Read()
		if err != nil {
			t.Fatalf("fetch answer: %v", err)
		}
		if kind == pktline.Flush && inPack {
			return answer.Bytes()
		}
		inPack = inPack || string(line) == "packfile\n"
	}
}
