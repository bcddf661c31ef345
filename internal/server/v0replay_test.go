package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"packwire/internal/fetchcache"
	"packwire/internal/gittest"
	"packwire/internal/governor"
	"packwire/internal/pktline"
)

// v0SessionCases are the stateful transports and versions whose sessions
// are recorded: git:// and SSH, protocol v0 and v1.
func v0SessionCases(s *testServer, sshEnv []string) []transportCase {
	var cases []transportCase
	for _, v := range []int{0, 1} {
		cases = append(cases,
			transportCase{name: fmt.Sprintf("git-v%d", v), version: v, url: s.gitURL},
			transportCase{name: fmt.Sprintf("ssh-v%d", v), version: v, url: s.sshURL, env: sshEnv})
	}
	return cases
}

// runV0 runs git with the case's protocol version and checks with the
// packet trace that v0 (no "version" line) or v1 ("version 1") was spoken.
func (c transportCase) runV0(t *testing.T, s *testServer, dir string, args ...string) string {
	t.Helper()
	out, err := s.env.Run(dir, append(protocolEnv(c.version), c.env...), args...)
	if err != nil {
		t.Errorf("%s: git %v: %v\n%s", c.name, args, err, lastLines(out, 30))
		return out
	}
	v1 := strings.Contains(out, "< version 1")
	if strings.Contains(out, "< version 2") || (c.version == 1) != v1 {
		t.Errorf("%s: wanted protocol v%d, the trace says otherwise:\n%s", c.name, c.version, lastLines(out, 20))
	}
	return out
}

// ciRunners clones n runners of name at its tip over the case's transport.
func ciRunners(t *testing.T, s *testServer, tc transportCase, name string, n int) []string {
	t.Helper()
	dirs := make([]string, n)
	for i := range dirs {
		dirs[i] = filepath.Join(t.TempDir(), "runner")
		tc.runV0(t, s, "", "clone", "-q", "--no-checkout", tc.url(name), dirs[i])
	}
	return dirs
}

// fetchAll runs git fetch in every dir at once and returns the traces.
func fetchAll(t *testing.T, s *testServer, tc transportCase, dirs []string) []string {
	t.Helper()
	traces := make([]string, len(dirs))
	var wg sync.WaitGroup
	for i, d := range dirs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			traces[i] = tc.runV0(t, s, d, "fetch", "-q", "origin")
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.Logf("server log:\n%s", lastLines(s.logs.String(), 30))
		t.FailNow()
	}
	return traces
}

// sessionFetches waits for n fetch records of transport after seq.
func sessionFetches(t *testing.T, s *testServer, seq int64, transport string, n int) []governor.Record {
	t.Helper()
	isFetch := func(r governor.Record) bool {
		return r.Transport == transport && (r.Kind == "incremental-fetch" || r.Kind == "negotiation")
	}
	recs := s.recordsAfter(t, seq, func(r []governor.Record) bool {
		count := 0
		for _, x := range r {
			if isFetch(x) {
				count++
			}
		}
		return count >= n
	})
	var out []governor.Record
	for _, r := range recs {
		if isFetch(r) {
			out = append(out, r)
		}
	}
	return out
}

// longHistory makes a repository whose v0 fetches negotiate in rounds:
// with 40 commits the client sends 16 haves and a flush, 16 more and a
// flush, and only then reads git's ACKs.
func longHistory(t *testing.T, s *testServer, name string) string {
	t.Helper()
	r, err := s.Data.Repos.Create(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	s.env.Build(r.Path, gittest.Shape{Commits: 40, Files: 10, BlobBytes: 4000, Seed: 5})
	settle(t, r.Path)
	return r.Path
}

// TestV0SessionHerd: CI runners at the same old commit fetch at once after
// a push over git:// and SSH, protocol v0 and v1, negotiating in rounds
// (which the fetch cache's whole requests never see). Their sessions share
// one git: of 6 runners at most 2 ran git (the first recording is kept
// only once a second identical session was seen; runners that start
// together follow it either way), the others were replayed, and every
// runner has the pushed commit, fsck-clean. Before recordings, each
// runner's session ran its own git.
func TestV0SessionHerd(t *testing.T) {
	t.Parallel()
	enableSSH, sshEnvFor := withSSH(t)
	s := startServer(t, enableSSH)
	sshEnv := sshEnvFor(s)
	const runners = 6
	for _, tc := range v0SessionCases(s, sshEnv) {
		t.Run(tc.name, func(t *testing.T) {
			name := "herd/" + tc.name
			bare := longHistory(t, s, name)
			dirs := ciRunners(t, s, tc, name, runners)
			head := pushCommit(t, s, name, "after.txt")
			settle(t, bare)
			seq := s.lastSeq(t)
			traces := fetchAll(t, s, tc, dirs)
			if !strings.Contains(traces[0], "> 0000") || strings.Count(traces[0], "> have ") < 17 {
				t.Fatalf("the fetch did not negotiate in rounds:\n%s", lastLines(traces[0], 40))
			}
			recs := sessionFetches(t, s, seq, strings.SplitN(tc.name, "-", 2)[0], runners)
			got := outcomeCounts(recs)
			t.Logf("outcomes: %v", got)
			ranGit := runners - got[fetchcache.Replayed+"/ok"]
			if ranGit < 1 || ranGit > 2 || len(recs) != runners {
				t.Fatalf("outcomes of %d identical fetch sessions: %v", runners, got)
			}
			for _, d := range dirs {
				if got := s.env.RevParse(d, "origin/main"); got != head {
					t.Fatalf("runner has origin/main at %s, want %s", got, head)
				}
				s.env.Fsck(d)
			}
		})
	}
}

// TestV0SessionDivergence: a herd in which some runners hold a commit of
// their own, dated inside the others' second batch of haves. They open
// their sessions as the others do (same wants, same first 16 haves) and
// depart from the recording at their second batch: they get a git fed
// what they sent, whose answers are checked against what they were sent
// already, and continue with it. Runners at another commit altogether
// (another opening) fetch too. Every runner ends with the pushed commit,
// fsck-clean.
func TestV0SessionDivergence(t *testing.T) {
	t.Parallel()
	enableSSH, sshEnvFor := withSSH(t)
	s := startServer(t, enableSSH)
	sshEnv := sshEnvFor(s)
	for _, tc := range v0SessionCases(s, sshEnv)[:2] {
		t.Run(tc.name, func(t *testing.T) {
			name := "diverge/" + tc.name
			bare := longHistory(t, s, name)
			dirs := ciRunners(t, s, tc, name, 6)
			// Runners 4 and 5: a local commit dated between the
			// history's 21st and 22nd commits (see gittest.Build's dates),
			// on a branch of its own: its have comes in the second batch.
			when := fmt.Sprintf("%d +0000", 1767225600+20*60+30)
			for _, d := range dirs[4:] {
				env := []string{"GIT_COMMITTER_DATE=" + when, "GIT_AUTHOR_DATE=" + when}
				tree := strings.TrimSpace(s.env.Git(d, "write-tree"))
				out, err := s.env.Run(d, env, "commit-tree", "-m", "local", tree)
				if err != nil {
					t.Fatal(err, out)
				}
				s.env.Git(d, "update-ref", "refs/heads/local", strings.TrimSpace(out))
			}
			// Runner 3: one commit behind the others (another opening).
			s.env.Git(dirs[3], "update-ref", "refs/remotes/origin/main", "origin/main~1")
			s.env.Git(dirs[3], "update-ref", "refs/heads/main", "main~1")
			head := pushCommit(t, s, name, "after.txt")
			settle(t, bare)
			seq := s.lastSeq(t)
			traces := fetchAll(t, s, tc, dirs)
			// The diverging runners opened as the herd did, and differed after.
			if a, b := haveBatches(traces[0]), haveBatches(traces[4]); len(a) < 2 || len(b) < 2 || a[0] != b[0] || a[1] == b[1] {
				t.Fatalf("runner 4's have batches are not the herd's first and another second:\n%q\n%q", a, b)
			}
			recs := sessionFetches(t, s, seq, strings.SplitN(tc.name, "-", 2)[0], len(dirs))
			t.Logf("outcomes: %v", outcomeCounts(recs))
			for _, r := range recs {
				if r.Result != governor.ResultOK {
					t.Fatalf("a session ended %s: %s", r.Result, r.Error)
				}
			}
			for _, d := range dirs {
				if got := s.env.RevParse(d, "origin/main"); got != head {
					t.Fatalf("runner has origin/main at %s, want %s", got, head)
				}
				s.env.Fsck(d)
			}
		})
	}
}

// haveBatches splits the have lines a client traced into its batches (a
// flush ends each).
func haveBatches(trace string) []string {
	var batches []string
	var cur strings.Builder
	for _, line := range strings.Split(trace, "\n") {
		switch {
		case strings.Contains(line, "> have "):
			cur.WriteString(line[strings.Index(line, "> have ")+7:] + ",")
		case strings.HasSuffix(line, "> 0000") && cur.Len() > 0:
			batches = append(batches, cur.String())
			cur.Reset()
		}
	}
	return batches
}

// roundRequest is a v0 request with a negotiation round: the wants, a
// flush, a round with no haves (a flush: git answers NAK), done. The
// fetch cache's whole requests never take it; a recording does.
func roundRequest(tip string) []byte {
	var b bytes.Buffer
	pktline.Write(&b, []byte("want "+tip+" multi_ack_detailed side-band-64k ofs-delta no-progress agent=packwire-test\n"))
	pktline.WriteFlush(&b)
	pktline.WriteFlush(&b)
	pktline.Write(&b, []byte("done\n"))
	return b.Bytes()
}

// roundSession opens a git:// v0 session of repo, reads the
// advertisement, sends roundRequest(tip) and reads the answer: all of it,
// or limit bytes (the session is returned open then).
func roundSession(t *testing.T, s *testServer, repo, tip string, limit int) ([]byte, *rawSession) {
	t.Helper()
	sess := dialUploadPack(t, s, repo, false)
	sess.advertisement(t)
	if _, err := sess.conn.Write(roundRequest(tip)); err != nil {
		t.Fatal(err)
	}
	if limit > 0 {
		buf := make([]byte, limit)
		if _, err := io.ReadFull(sess.r, buf); err != nil {
			t.Fatal(err)
		}
		return buf, sess
	}
	answer, err := io.ReadAll(sess.r)
	if err != nil {
		t.Fatal(err)
	}
	return answer, nil
}

// gitSessionRecord waits for the first git:// upload-pack record after
// seq that is not an advertisement alone.
func gitSessionRecord(t *testing.T, s *testServer, seq int64) governor.Record {
	t.Helper()
	match := func(x governor.Record) bool { return x.Transport == "git" && x.Kind != "refs" && x.Kind != "no-op" }
	recs := s.recordsAfter(t, seq, func(r []governor.Record) bool { return slices.ContainsFunc(r, match) })
	return recs[slices.IndexFunc(recs, match)]
}

// TestV0SessionReplayEdges, over git:// v0 with a hand-written client
// whose request has a negotiation round, and an answer of 16 MiB:
//   - the third identical session is replayed from the recording (no git,
//     the same bytes as the recorded answer);
//   - a client that hangs up mid-replay leaves the next replay whole;
//   - a push that lands while a replay streams does not change it, and
//     the next clone has the push;
//   - a leader whose client hangs up mid-pack while another session
//     follows its recording: the follower still gets a whole answer.
func TestV0SessionReplayEdges(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	name := "recorded-edges"
	bare := s.answerOnlyRepo(t, name)
	tip := s.env.RevParse(bare, "main")
	settle(t, bare)

	roundSession(t, s, name, tip, 0)                // leads: recorded, kept on a second sighting
	recorded, _ := roundSession(t, s, name, tip, 0) // leads again: kept
	seq := s.lastSeq(t)
	replayed, _ := roundSession(t, s, name, tip, 0)
	if rec := gitSessionRecord(t, s, seq); rec.PackCache != fetchcache.Replayed || rec.Result != governor.ResultOK || rec.CPU() > replayCPU {
		t.Fatalf("third identical session: %s/%s, %v of CPU", rec.PackCache, rec.Result, rec.CPU())
	}
	if !bytes.Equal(replayed, recorded) {
		t.Fatal("the replay differs from the recorded session")
	}
	if n := indexPack(t, s, answerPack(t, replayed, false)); n == 0 {
		t.Fatal("no objects in the replayed answer")
	}

	seq = s.lastSeq(t)
	_, sess := roundSession(t, s, name, tip, 100<<10)
	sess.conn.Close() // hang up mid-replay
	if rec := gitSessionRecord(t, s, seq); rec.PackCache != fetchcache.Replayed || rec.Result != governor.ResultClientGone {
		t.Fatalf("the replay whose client left: %s/%s", rec.PackCache, rec.Result)
	}
	seq = s.lastSeq(t)
	if again, _ := roundSession(t, s, name, tip, 0); !bytes.Equal(again, recorded) {
		t.Fatal("the replay after a client hung up differs from the recorded session")
	}
	if rec := gitSessionRecord(t, s, seq); rec.PackCache != fetchcache.Replayed || rec.Result != governor.ResultOK {
		t.Fatalf("replay after a hang-up: %s/%s", rec.PackCache, rec.Result)
	}

	// A push while a replay streams.
	seq = s.lastSeq(t)
	head, sess := roundSession(t, s, name, tip, 100<<10)
	pushed := pushCommit(t, s, name, "during.txt")
	rest, err := io.ReadAll(sess.r)
	if err != nil {
		t.Fatal(err)
	}
	sess.conn.Close()
	if !bytes.Equal(append(head, rest...), recorded) {
		t.Fatal("a replay changed under a push")
	}
	if rec := gitSessionRecord(t, s, seq); rec.PackCache != fetchcache.Replayed {
		t.Fatalf("the session a push landed under: %s/%s", rec.PackCache, rec.Result)
	}
	dir := filepath.Join(t.TempDir(), "next")
	s.env.Git("", "clone", "-q", "--bare", s.gitURL(name), dir)
	if got := s.env.RevParse(dir, "main"); got != pushed {
		t.Fatalf("the clone after the push has main at %s, want %s", got, pushed)
	}
	s.env.Fsck(dir)

	// The leader leaves mid-pack while a session follows it: its git goes
	// on for the follower.
	settle(t, bare)
	seq = s.lastSeq(t)
	_, leader := roundSession(t, s, name, pushed, 64<<10)
	// The follower reads what the leader's stalled client let through (it
	// follows the recording then), and the leader hangs up.
	start, follower := roundSession(t, s, name, pushed, 64<<10)
	leader.conn.Close()
	rest, err = io.ReadAll(follower.r)
	if err != nil {
		t.Fatal(err)
	}
	followed := append(start, rest...)
	if n := indexPack(t, s, answerPack(t, followed, false)); n == 0 {
		t.Fatal("no objects in the follower's answer")
	}
	recs := s.recordsAfter(t, seq, func(r []governor.Record) bool {
		n := 0
		for _, x := range r {
			if x.Transport == "git" && x.Kind != "refs" {
				n++
			}
		}
		return n >= 2
	})
	got := map[string]int{}
	for _, r := range recs {
		if r.Transport == "git" && r.Kind != "refs" {
			got[r.PackCache+"/"+r.Result]++
		}
	}
	if got[fetchcache.Replayed+"/"+governor.ResultOK] != 1 {
		t.Fatalf("a leader that left and its follower: %v", got)
	}
}

// TestV0SessionAnswersPerUserAndConfig: recordings are per user and per
// repository state, config included. ls-remote sessions (v0) of alice
// over SSH are replayed from the third on; an anonymous git:// session of
// the very same bytes is not given alice's recording. A branch hidden by
// the repository's transfer.hideRefs after recordings were made is not
// listed, nor fetchable.
func TestV0SessionAnswersPerUserAndConfig(t *testing.T) {
	t.Parallel()
	enableSSH, sshEnvFor := withSSH(t)
	s := startServer(t, enableSSH)
	sshEnv := sshEnvFor(s)
	name := "peruser"
	bare := s.seed(t, name)
	s.env.Git(bare, "branch", "secret", "main")
	settle(t, bare)
	ssh := transportCase{name: "ssh-v0", version: 0, url: s.sshURL, env: sshEnv}
	git := transportCase{name: "git-v0", version: 0, url: s.gitURL}
	refsRecord := func(seq int64, transport string) governor.Record {
		t.Helper()
		match := func(x governor.Record) bool { return x.Transport == transport && x.Kind == "no-op" }
		recs := s.recordsAfter(t, seq, func(r []governor.Record) bool { return slices.ContainsFunc(r, match) })
		return recs[slices.IndexFunc(recs, match)]
	}
	for range 2 {
		ssh.runV0(t, s, "", "ls-remote", ssh.url(name))
	}
	seq := s.lastSeq(t)
	if out := ssh.runV0(t, s, "", "ls-remote", ssh.url(name)); !strings.Contains(out, "refs/heads/secret") {
		t.Fatalf("alice's ls-remote does not list the branch:\n%s", lastLines(out, 10))
	}
	if rec := refsRecord(seq, "ssh"); rec.PackCache != fetchcache.Replayed {
		t.Fatalf("alice's third ls-remote: %s/%s", rec.PackCache, rec.Result)
	}
	seq = s.lastSeq(t)
	git.runV0(t, s, "", "ls-remote", git.url(name))
	if rec := refsRecord(seq, "git"); rec.PackCache == fetchcache.Replayed {
		t.Fatal("an anonymous session was given alice's recording")
	}

	s.env.Git(bare, "config", "transfer.hideRefs", "refs/heads/secret")
	settle(t, bare)
	for _, tc := range []transportCase{ssh, git} {
		if out := tc.runV0(t, s, "", "ls-remote", tc.url(name)); strings.Contains(out, "refs/heads/secret\n") {
			t.Fatalf("%s: a hidden branch is listed:\n%s", tc.name, lastLines(out, 10))
		}
	}
}

// TestV0SessionShallowAndFilter: shallow and partial clones and fetches
// over git:// and SSH v0, three of each in a row (the later ones may be
// replayed): every one correct and fsck-clean.
func TestV0SessionShallowAndFilter(t *testing.T) {
	t.Parallel()
	enableSSH, sshEnvFor := withSSH(t)
	s := startServer(t, enableSSH)
	sshEnv := sshEnvFor(s)
	for _, tc := range v0SessionCases(s, sshEnv)[:2] {
		t.Run(tc.name, func(t *testing.T) {
			name := "narrow/" + tc.name
			bare := longHistory(t, s, name)
			tip := s.env.RevParse(bare, "main")
			for i := range 3 {
				shallow := filepath.Join(t.TempDir(), "shallow")
				tc.runV0(t, s, "", "clone", "-q", "--bare", "--depth", "2", tc.url(name), shallow)
				if got := strings.Count(strings.TrimSpace(s.env.Git(shallow, "rev-list", "main")), "\n") + 1; got != 2 || s.env.RevParse(shallow, "main") != tip {
					t.Fatalf("shallow clone %d: %d commits", i, got)
				}
				s.env.Fsck(shallow)
				partial := filepath.Join(t.TempDir(), "partial")
				tc.runV0(t, s, "", "clone", "-q", "--bare", "--filter=blob:none", tc.url(name), partial)
				if s.env.RevParse(partial, "main") != tip {
					t.Fatalf("partial clone %d: wrong main", i)
				}
				s.env.Fsck(partial)
			}
			head := pushCommit(t, s, name, "deeper.txt")
			settle(t, bare)
			for i := range 3 {
				d := filepath.Join(t.TempDir(), "d")
				tc.runV0(t, s, "", "clone", "-q", "--depth", "1", tc.url(name), d)
				tc.runV0(t, s, d, "fetch", "-q", "--deepen", "3", "origin")
				if got := strings.Count(strings.TrimSpace(s.env.Git(d, "rev-list", "origin/main")), "\n") + 1; got != 4 || s.env.RevParse(d, "origin/main") != head {
					t.Fatalf("deepened fetch %d: %d commits", i, got)
				}
				s.env.Fsck(d)
			}
		})
	}
}

// TestV0SessionSilentLeader: the first session of a repository state
// reads its advertisement and sends nothing; another session of the same
// state must not wait for it (the advertisement is kept after at most
// advertisementHold), and gets the same refs. Before the bound it waited
// for the first session to end (its idle timeout); the client is given
// 30 s here so that the test fails rather than hangs.
func TestV0SessionSilentLeader(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	name := "silent"
	bare := s.seed(t, name)
	settle(t, bare)
	silent := dialUploadPack(t, s, name, false)
	refs := silent.advertisement(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "git", "ls-remote", s.gitURL(name))
	cmd.Env = append(append([]string{}, s.env.Vars...), protocolEnv(0)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("ls-remote while the first session is silent: %v\n%s", err, lastLines(string(out), 10))
	}
	assertProtocol(t, string(out), 0)
	head := s.env.RevParse(bare, "main")
	if !strings.Contains(string(out), head+"\trefs/heads/main") || !strings.Contains(refs[0], head) {
		t.Fatalf("the sessions disagree on main (%s):\n%s\n%q", head, lastLines(string(out), 5), refs[0])
	}
	silent.conn.Close()
}
