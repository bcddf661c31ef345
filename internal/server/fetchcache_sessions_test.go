package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
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

// transportCase is one transport and protocol version of the matrix.
type transportCase struct {
	name    string
	version int
	url     func(repo string) string
	env     []string // the client's extra environment (SSH's command)
	rounds  bool     // the incremental fetch negotiates in rounds
}

func transportCases(s *testServer, sshEnv []string) []transportCase {
	var cases []transportCase
	for _, v := range []int{0, 2} {
		cases = append(cases,
			transportCase{name: fmt.Sprintf("git-v%d", v), version: v, url: s.gitURL},
			transportCase{name: fmt.Sprintf("ssh-v%d", v), version: v, url: s.sshURL, env: sshEnv},
			transportCase{name: fmt.Sprintf("http-v%d", v), version: v, url: s.httpURL})
	}
	return cases
}

// run runs git with the case's protocol version, packet trace on, and
// checks that the version was really spoken.
func (c transportCase) run(t *testing.T, s *testServer, dir string, args ...string) string {
	t.Helper()
	out, err := s.env.Run(dir, append(protocolEnv(c.version), c.env...), args...)
	if err != nil {
		t.Fatalf("%s: git %v: %v\n%s", c.name, args, err, lastLines(out, 30))
	}
	assertProtocol(t, out, c.version)
	return out
}

// TestFetchCacheEveryTransport: over git://, SSH and HTTP, each with
// protocol v0 and v2, the second identical clone is replayed (no pack
// generated; the governor's record says replayed), gets the very same pack
// and is fsck-clean. After a push the next clone is generated and has it.
func TestFetchCacheEveryTransport(t *testing.T) {
	t.Parallel()
	enableSSH, sshEnvFor := withSSH(t)
	s := startServer(t, enableSSH)
	sshEnv := sshEnvFor(s)
	for _, tc := range transportCases(s, sshEnv) {
		t.Run(tc.name, func(t *testing.T) {
			name := "every/" + tc.name
			bare := s.seed(t, name)
			clone := func(what, outcome string) string {
				t.Helper()
				settle(t, bare)
				seq := s.lastSeq(t)
				dir := filepath.Join(t.TempDir(), "c")
				tc.run(t, s, "", "clone", "-q", "--bare", tc.url(name), dir)
				rec := s.fetchRecords(t, seq, "full-clone", 1)[0]
				if rec.PackCache != outcome || rec.Result != governor.ResultOK || rec.Transport != strings.SplitN(tc.name, "-", 2)[0] {
					t.Fatalf("%s: record %s/%s over %s, want %s/ok", what, rec.PackCache, rec.Result, rec.Transport, outcome)
				}
				s.env.Fsck(dir)
				return dir
			}
			first := clone("first clone", fetchcache.Generated)
			second := clone("second clone", fetchcache.Replayed)
			if a, b := packNamesBare(t, first), packNamesBare(t, second); a != b {
				t.Fatalf("the replayed clone's pack %s differs from the first's %s", b, a)
			}
			head := pushCommit(t, s, name, "pushed.txt")
			after := clone("clone after a push", fetchcache.Generated)
			if got := s.env.RevParse(after, "main"); got != head {
				t.Fatalf("clone after a push has main at %s, want %s", got, head)
			}
			clone("second clone after the push", fetchcache.Replayed)
		})
	}
}

// TestFetchCacheSharedIncremental: CI runners that cloned the same
// repository fetch at once after a push, over each transport and version.
// Their fetches (with haves) share one pack generation: of 8 fetchers at
// most two ran git (the first run is stored only once a second identical
// request was seen; runners that start together share the run either
// way), every other was replayed, and every runner has the pushed commit,
// fsck-clean. Over HTTP v0 also with a history long enough that the
// client negotiates in a round and gets its pack in that round's answer.
func TestFetchCacheSharedIncremental(t *testing.T) {
	t.Parallel()
	enableSSH, sshEnvFor := withSSH(t)
	s := startServer(t, enableSSH)
	sshEnv := sshEnvFor(s)
	const runners = 8
	cases := transportCases(s, sshEnv)
	cases = append(cases, transportCase{name: "http-v0-rounds", version: 0, url: s.httpURL, rounds: true})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			name := "ci/" + tc.name
			r, err := s.Data.Repos.Create(context.Background(), name)
			if err != nil {
				t.Fatal(err)
			}
			if tc.rounds {
				// A long history: the v0 client sends 16 haves and a flush,
				// a round, whose answer carries the pack once git is ready
				// (smart HTTP's no-done).
				s.env.Build(r.Path, gittest.Shape{Commits: 40, Files: 10, BlobBytes: 4000, Seed: 3})
			} else {
				// A short history: a v0 client then sends fewer than 16
				// haves, no negotiation round (see fetchcache.Inspect).
				s.env.Build(r.Path, gittest.Shape{Commits: 6, Files: 10, BlobBytes: 4000, Seed: 3})
			}
			settle(t, r.Path)
			// One clone, copied: the runners' fetches are what is tested.
			dirs := make([]string, runners)
			for i := range dirs {
				dirs[i] = filepath.Join(t.TempDir(), "runner")
				if i == 0 {
					tc.run(t, s, "", "clone", "-q", tc.url(name), dirs[i])
				} else if out, err := exec.Command("cp", "-a", dirs[0], dirs[i]).CombinedOutput(); err != nil {
					t.Fatalf("copy the clone: %v %s", err, out)
				}
			}
			head := pushCommit(t, s, name, "after.txt")
			settle(t, r.Path)
			seq := s.lastSeq(t)
			var wg sync.WaitGroup
			for _, d := range dirs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					tc.run(t, s, d, "fetch", "-q", "origin")
				}()
			}
			wg.Wait()
			kind := "incremental-fetch"
			if tc.rounds {
				// The classifier tells a v0 round by its request alone
				// (no done): "negotiation", though its answer had the pack.
				kind = "negotiation"
			}
			recs := s.fetchRecords(t, seq, kind, runners)
			got := outcomeCounts(recs)
			if got["generated/ok"] < 1 || got["generated/ok"] > 2 || got["generated/ok"]+got["replayed/ok"] != runners {
				t.Fatalf("outcomes of %d identical fetches: %v", runners, got)
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

// rawSession is a hand-written git:// upload-pack client: it sends exactly
// the same request each time, so that the test controls how much of the
// answer it reads.
type rawSession struct {
	conn net.Conn
	r    *bufio.Reader
}

func dialUploadPack(t *testing.T, s *testServer, repo string, v2 bool) *rawSession {
	t.Helper()
	conn, err := net.Dial("tcp", s.GitAddr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	header := "git-upload-pack /" + repo + "\x00host=localhost\x00"
	if v2 {
		header += "\x00version=2\x00"
	}
	if err := pktline.Write(conn, []byte(header)); err != nil {
		t.Fatal(err)
	}
	return &rawSession{conn: conn, r: bufio.NewReader(conn)}
}

// advertisement reads up to the first flush and returns the lines.
func (r *rawSession) advertisement(t *testing.T) []string {
	t.Helper()
	pr := pktline.NewReader(r.r)
	var lines []string
	for {
		kind, line, err := pr.Read()
		if err != nil {
			t.Fatal(err)
		}
		if kind == pktline.Flush {
			return lines
		}
		lines = append(lines, strings.TrimSuffix(string(line), "\n"))
	}
}

// cloneRequest is the request of a full clone of tip: v0 (after the
// advertisement) or a v2 fetch command.
func cloneRequest(tip string, v2 bool) []byte {
	var b bytes.Buffer
	if v2 {
		pktline.Write(&b, []byte("command=fetch\n"))
		pktline.Write(&b, []byte("agent=packwire-test\n"))
		b.WriteString("0001")
		for _, l := range []string{"ofs-delta", "no-progress", "want " + tip, "done"} {
			pktline.Write(&b, []byte(l+"\n"))
		}
		pktline.WriteFlush(&b)
		return b.Bytes()
	}
	pktline.Write(&b, []byte("want "+tip+" side-band-64k ofs-delta no-progress agent=packwire-test\n"))
	pktline.WriteFlush(&b)
	pktline.Write(&b, []byte("done\n"))
	return b.Bytes()
}

// pack demultiplexes an answer (v0: NAK then side-band; v2: a packfile
// section) into the pack it carries.
func answerPack(t *testing.T, answer []byte, v2 bool) []byte {
	t.Helper()
	pr := pktline.NewReader(bytes.NewReader(answer))
	var pack []byte
	inPack := !v2
	for {
		kind, line, err := pr.Read()
		if err == io.EOF || kind == pktline.Flush && inPack {
			return pack
		}
		if err != nil {
			t.Fatalf("answer: %v", err)
		}
		switch {
		case kind != pktline.Data:
		case !inPack:
			inPack = string(line) == "packfile\n"
		case string(line) == "NAK\n":
		case line[0] == 1:
			pack = append(pack, line[1:]...)
		case line[0] == 3:
			t.Fatalf("error in the answer: %s", line[1:])
		}
	}
}

// indexPack checks a pack with git index-pack in an empty repository
// and returns its object count.
func indexPack(t *testing.T, s *testServer, pack []byte) int {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "idx.git")
	s.env.Git("", "init", "-q", "--bare", dir)
	cmd := exec.Command("git", "index-pack", "--stdin")
	cmd.Dir, cmd.Env, cmd.Stdin = dir, s.env.Vars, bytes.NewReader(pack)
	if out, err := cmd.CombinedOutput(); err != nil || len(pack) < 12 {
		t.Fatalf("index-pack: %v %s", err, out)
	}
	return int(binary.BigEndian.Uint32(pack[8:12])) // the header index-pack checked
}

// fetchRaw opens a session, reads its advertisement (v0: the refs; v2:
// the capabilities), calls between (if set) after it, sends the clone request of tip and reads the answer: all
// of it, or only limit bytes before hanging up (limit > 0).
func fetchRaw(t *testing.T, s *testServer, repo, tip string, v2 bool, limit int, between func()) []byte {
	t.Helper()
	sess := dialUploadPack(t, s, repo, v2)
	sess.advertisement(t)
	if between != nil {
		between()
	}
	if _, err := sess.conn.Write(cloneRequest(tip, v2)); err != nil {
		t.Fatal(err)
	}
	if limit > 0 {
		buf := make([]byte, limit)
		if _, err := io.ReadFull(sess.r, buf); err != nil {
			t.Fatal(err)
		}
		sess.conn.Close() // hang up mid-answer
		return buf
	}
	if v2 {
		// The session stays open for another command: read to the
		// answer's end (its last flush after the pack), then end it.
		var answer bytes.Buffer
		pr := pktline.NewReader(io.TeeReader(sess.r, &answer))
		inPack := false
		for {
			kind, line, err := pr.Read()
			if err != nil {
				t.Fatal(err)
			}
			if kind == pktline.Flush && inPack {
				break
			}
			inPack = inPack || string(line) == "packfile\n"
		}
		pktline.WriteFlush(sess.conn)
		return answer.Bytes()
	}
	answer, err := io.ReadAll(sess.r)
	if err != nil {
		t.Fatal(err)
	}
	return answer
}

// TestFetchCacheSessionReplayEdges, over git:// v0 and v2 with a
// hand-written client and an answer of 16 MiB:
//   - a client that hangs up mid-replay leaves the next replay whole;
//   - a push that lands while a replay streams does not change it (the
//     same bytes as the stored answer), and the next clone has the push;
//   - v0: a push between the advertisement and the request makes the
//     request git's (not replayed): the answer is the one to the refs the
//     client saw, and valid.
func TestFetchCacheSessionReplayEdges(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	for _, v2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("v2=%v", v2), func(t *testing.T) {
			name := fmt.Sprintf("edges%v", v2)
			bare := s.answerOnlyRepo(t, name)
			tip := s.env.RevParse(bare, "main")
			// The first git:// clone record after seq (pushCommit clones
			// over HTTP).
			outcome := func(seq int64) governor.Record {
				t.Helper()
				recs := s.recordsAfter(t, seq, func(r []governor.Record) bool {
					return slices.ContainsFunc(r, func(x governor.Record) bool { return x.Transport == "git" && x.Kind == "full-clone" })
				})
				i := slices.IndexFunc(recs, func(x governor.Record) bool { return x.Transport == "git" && x.Kind == "full-clone" })
				return recs[i]
			}

			seq := s.lastSeq(t)
			stored := fetchRaw(t, s, name, tip, v2, 0, nil)
			if rec := outcome(seq); rec.PackCache != fetchcache.Generated {
				t.Fatalf("first request: %+v", rec)
			}
			objects := indexPack(t, s, answerPack(t, stored, v2))
			if objects == 0 {
				t.Fatal("no objects in the first answer")
			}

			seq = s.lastSeq(t)
			fetchRaw(t, s, name, tip, v2, 100<<10, nil)
			if rec := outcome(seq); rec.PackCache != fetchcache.Replayed || rec.Result != governor.ResultClientGone {
				t.Fatalf("replay the client left: %s/%s", rec.PackCache, rec.Result)
			}
			seq = s.lastSeq(t)
			if again := fetchRaw(t, s, name, tip, v2, 0, nil); !bytes.Equal(again, stored) {
				t.Fatal("the replay after a client hung up differs from the stored answer")
			}
			if rec := outcome(seq); rec.PackCache != fetchcache.Replayed || rec.Result != governor.ResultOK || rec.CPU() > replayCPU {
				t.Fatalf("replay after a hang-up: %+v", rec)
			}

			// A push while a replay streams: the client reads 100 KiB,
			// the push lands, the client reads the rest.
			sess := dialUploadPack(t, s, name, v2)
			sess.advertisement(t)
			seq = s.lastSeq(t)
			if _, err := sess.conn.Write(cloneRequest(tip, v2)); err != nil {
				t.Fatal(err)
			}
			head := make([]byte, 100<<10)
			if _, err := io.ReadFull(sess.r, head); err != nil {
				t.Fatal(err)
			}
			pushed := pushCommit(t, s, name, "during.txt")
			want := len(stored) - len(head)
			rest := make([]byte, want)
			if _, err := io.ReadFull(sess.r, rest); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(append(head, rest...), stored) {
				t.Fatal("a replay changed under a push")
			}
			if !v2 {
				if extra, _ := io.ReadAll(sess.r); len(extra) > 0 {
					t.Fatalf("%d bytes after the stored answer", len(extra))
				}
			}
			sess.conn.Close()
			if rec := outcome(seq); rec.PackCache != fetchcache.Replayed {
				t.Fatalf("the request a push landed under: %+v", rec)
			}
			dir := filepath.Join(t.TempDir(), "next")
			s.env.Git("", "clone", "-q", "--bare", s.gitURL(name), dir)
			if got := s.env.RevParse(dir, "main"); got != pushed {
				t.Fatalf("the clone after the push has main at %s, want %s", got, pushed)
			}
			s.env.Fsck(dir)

			if v2 {
				return
			}
			// v0: a push between advertisement and request.
			settle(t, bare)
			old := s.env.RevParse(bare, "main")
			fetchRaw(t, s, name, old, false, 0, nil) // stored for the refs now
			seq = s.lastSeq(t)
			answer := fetchRaw(t, s, name, old, false, 0, func() { pushCommit(t, s, name, "between.txt"); settle(t, bare) })
			rec := outcome(seq)
			if rec.PackCache == fetchcache.Replayed || rec.Result != governor.ResultOK {
				t.Fatalf("a request whose advertisement a push outdated: %s/%s", rec.PackCache, rec.Result)
			}
			if n := indexPack(t, s, answerPack(t, answer, false)); n == 0 {
				t.Fatal("no objects in git's answer")
			}
		})
	}
}

// replayCPU bounds what a replayed session may cost: its own git's
// advertisement, nothing like a pack (far above an advertisement's few
// milliseconds, far below compressing 16 MiB).
const replayCPU = 100 * time.Millisecond
