package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
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
	"packwire/internal/procgroup"
	"packwire/internal/repostate"
)

// settle waits until the repository's last change is older than the fetch
// cache's racy window, so that the next fetch may be cached.
func settle(t *testing.T, repo string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s, err := repostate.Refs(repo, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if !s.Racy {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("repository %s keeps changing", repo)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// fetchRecords waits for n records of kind after seq and returns them.
func (s *testServer) fetchRecords(t *testing.T, seq int64, kind string, n int) []governor.Record {
	t.Helper()
	recs := s.recordsAfter(t, seq, func(r []governor.Record) bool {
		count := 0
		for _, x := range r {
			if x.Kind == kind {
				count++
			}
		}
		return count >= n
	})
	var out []governor.Record
	for _, r := range recs {
		if r.Kind == kind {
			out = append(out, r)
		}
	}
	return out
}

// outcomeCounts counts records by "pack_cache/result".
func outcomeCounts(recs []governor.Record) map[string]int {
	m := map[string]int{}
	for _, r := range recs {
		m[r.PackCache+"/"+r.Result]++
	}
	return m
}

// v2 makes the client speak protocol v2 (the fetch cache's protocol).
var v2 = []string{"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=protocol.version", "GIT_CONFIG_VALUE_0=2"}

// cloneAll runs the clones (git clone ARGS... URL DIR_i) at once and fails
// on any error.
func (s *testServer) cloneAll(t *testing.T, n int, url string, args ...string) []string {
	t.Helper()
	dirs := make([]string, n)
	errs := make(chan string, n)
	var wg sync.WaitGroup
	for i := range dirs {
		dirs[i] = filepath.Join(t.TempDir(), "c")
		wg.Add(1)
		go func() {
			defer wg.Done()
			if out, err := s.env.Run("", v2, append(append([]string{"clone"}, args...), url, dirs[i])...); err != nil {
				errs <- err.Error() + ": " + out
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	return dirs
}

// TestFetchCacheHerd: identical concurrent HTTP clones are fsck-clean and
// identical; exactly one of them ran git, the others were replayed (no
// git, no CPU); a later identical clone is replayed whole from disk, with
// a Content-Length (the sendfile path).
func TestFetchCacheHerd(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	r, _ := s.Data.Repos.Create(context.Background(), "herd")
	s.env.Build(r.Path, gittest.Shape{Commits: 10, Files: 20, BlobBytes: 64 << 10, Incompress: true, Branches: 2, Tags: 2, Seed: 5})
	settle(t, r.Path)

	seq := s.lastSeq(t)
	dirs := s.cloneAll(t, 8, s.httpURL("herd"), "-q", "--bare")
	first := packNamesBare(t, dirs[0])
	for _, d := range dirs {
		if p := packNamesBare(t, d); p != first {
			t.Fatalf("clones differ: %s vs %s", p, first)
		}
		s.env.Fsck(d)
	}
	recs := s.fetchRecords(t, seq, "full-clone", 8)
	if got := outcomeCounts(recs); got["generated/ok"] != 1 || got["replayed/ok"] != 7 {
		t.Fatalf("outcomes %v", got)
	}
	var gen governor.Record
	for _, rec := range recs {
		if rec.PackCache == fetchcache.Generated {
			gen = rec
		}
	}
	if gen.CPU() == 0 || gen.MaxRSS == 0 {
		t.Fatalf("the run's record has no git cost: %+v", gen)
	}
	for _, rec := range recs {
		if rec.PackCache == fetchcache.Replayed && (rec.CPU() != 0 || rec.MaxRSS != 0 || rec.BytesOut != gen.BytesOut || rec.Wants != gen.Wants) {
			t.Fatalf("replay %+v against the run %+v", rec, gen)
		}
	}

	// Later, the same clone: replayed from the stored file, sent whole.
	seq = s.lastSeq(t)
	dir := filepath.Join(t.TempDir(), "again")
	out, err := s.env.Run("", append(v2, "GIT_TRACE_CURL=1", "GIT_TRACE_CURL_NO_DATA=1"), "clone", "-q", "--bare", s.httpURL("herd"), dir)
	if err != nil {
		t.Fatal(err, out)
	}
	if packNamesBare(t, dir) != first {
		t.Fatal("the replayed clone differs")
	}
	rec := s.fetchRecords(t, seq, "full-clone", 1)[0]
	if rec.PackCache != fetchcache.Replayed || rec.CPU() != 0 || rec.MaxRSS != 0 || rec.Result != governor.ResultOK {
		t.Fatalf("repeat clone: %+v", rec)
	}
	if !strings.Contains(out, fmt.Sprintf("Content-Length: %d", rec.BytesOut)) {
		t.Fatalf("the stored response was not sent with its length:\n%s", lastLines(out, 30))
	}
}

func packNamesBare(t *testing.T, bare string) string {
	t.Helper()
	entries, err := filepath.Glob(filepath.Join(bare, "objects", "pack", "*.pack"))
	if err != nil || len(entries) != 1 {
		t.Fatalf("clone %s has packs %v", bare, entries)
	}
	return filepath.Base(entries[0])
}

// TestFetchCacheKeys: a push, a config change and a deleted branch each
// make the next identical request a miss; shallow and filtered clones
// have their own entries; git:// and SSH share HTTP's entries; a fetch with
// haves is stored on its second sighting.
func TestFetchCacheKeys(t *testing.T) {
	t.Parallel()
	enableSSH, sshEnvFor := withSSH(t)
	s := startServer(t, enableSSH)
	sshEnv := sshEnvFor(s)
	bare := s.seed(t, "team/app")
	url := s.httpURL("team/app")
	run := func(kind string, args ...string) (string, governor.Record) {
		t.Helper()
		settle(t, bare)
		seq := s.lastSeq(t)
		dir := filepath.Join(t.TempDir(), "c")
		if out, err := s.env.Run("", append(v2, sshEnv...), append(append([]string{"clone", "-q"}, args...), url, dir)...); err != nil {
			t.Fatal(err, out)
		}
		return dir, s.fetchRecords(t, seq, kind, 1)[0]
	}
	expect := func(what string, rec governor.Record, outcome string) {
		t.Helper()
		if rec.PackCache != outcome || rec.Result != governor.ResultOK {
			t.Fatalf("%s: %s/%s, want %s/ok", what, rec.PackCache, rec.Result, outcome)
		}
	}
	_, rec := run("full-clone", "--bare")
	expect("first clone", rec, fetchcache.Generated)
	_, rec = run("full-clone", "--bare")
	expect("second clone", rec, fetchcache.Replayed)

	head := pushCommit(t, s, "team/app", "new.txt")
	dir, rec := run("full-clone", "--bare")
	expect("clone after a push", rec, fetchcache.Generated)
	if got := s.env.RevParse(dir, "main"); got != head {
		t.Fatalf("clone after a push has main at %s, want %s", got, head)
	}
	_, rec = run("full-clone", "--bare")
	expect("second clone after the push", rec, fetchcache.Replayed)

	s.env.Git(bare, "config", "pack.compression", "1") // same refs, same request
	_, rec = run("full-clone", "--bare")
	expect("clone after a config change", rec, fetchcache.Generated)

	// Shallow and filtered clones: their own keys, correct clones.
	dir, rec = run("shallow-clone", "--depth", "1")
	expect("shallow clone", rec, fetchcache.Generated)
	dir, rec = run("shallow-clone", "--depth", "1")
	expect("second shallow clone", rec, fetchcache.Replayed)
	s.env.Fsck(dir)
	if got := strings.TrimSpace(s.env.Git(dir, "rev-parse", "--is-shallow-repository")); got != "true" {
		t.Fatalf("replayed --depth 1 clone is not shallow: %s", got)
	}
	if n := strings.TrimSpace(s.env.Git(dir, "rev-list", "--count", "HEAD")); n != "1" {
		t.Fatalf("replayed --depth 1 clone has %s commits", n)
	}
	_, rec = run("partial-clone", "--filter=blob:none", "--no-checkout")
	expect("filtered clone", rec, fetchcache.Generated)
	dir, rec = run("partial-clone", "--filter=blob:none", "--no-checkout")
	expect("second filtered clone", rec, fetchcache.Replayed)
	s.env.Fsck(dir)
	if got := strings.TrimSpace(s.env.Git(dir, "config", "remote.origin.promisor")) + " " + strings.TrimSpace(s.env.Git(dir, "config", "remote.origin.partialclonefilter")); got != "true blob:none" {
		t.Fatalf("promisor config of the replayed partial clone: %s", got)
	}
	if out := s.env.Git(dir, "rev-list", "--objects", "--missing=print", "HEAD"); !strings.Contains(out, "?") {
		t.Fatal("the filtered clone has every blob")
	}
	s.env.Git(dir, "reset", "-q", "--hard") // lazy fetches of the blobs it needs
	s.env.Fsck(dir)

	// git:// and SSH sessions go through the same cache, with the same
	// keys: git's answer to a whole request is the same bytes there.
	for _, other := range []string{s.gitURL("team/app"), s.sshURL("team/app")} {
		url = other
		if _, rec = run("full-clone", "--bare"); rec.PackCache == "" {
			t.Fatalf("%s: %+v", other, rec)
		}
		_, rec = run("full-clone", "--bare")
		expect(other+": second clone", rec, fetchcache.Replayed)
	}
	url = s.httpURL("team/app")

	// Fetches with haves: stored on their second sighting, replayed on
	// the third; a fetch with other haves runs git.
	a, _ := run("full-clone")
	b, _ := run("full-clone")
	c, _ := run("full-clone")
	pushCommit(t, s, "team/app", "more.txt")
	settle(t, bare)
	seq := s.lastSeq(t)
	for _, dir := range []string{a, b, c} {
		s.env.Git(dir, "-c", "protocol.version=2", "fetch", "-q")
	}
	var outcomes []string
	for _, rec := range s.fetchRecords(t, seq, "incremental-fetch", 3) {
		if rec.Result != governor.ResultOK {
			t.Fatalf("incremental fetch: %+v", rec)
		}
		outcomes = append(outcomes, rec.PackCache)
	}
	if want := []string{fetchcache.Generated, fetchcache.Generated, fetchcache.Replayed}; !slices.Equal(outcomes, want) {
		t.Fatalf("three identical incremental fetches: %v, want %v", outcomes, want)
	}
	pushCommit(t, s, "team/app", "other.txt")
	settle(t, bare)
	seq = s.lastSeq(t)
	s.env.Git(a, "-c", "protocol.version=2", "fetch", "-q")
	if rec := s.fetchRecords(t, seq, "incremental-fetch", 1)[0]; rec.PackCache != fetchcache.Generated || rec.CPU() == 0 {
		t.Fatalf("a fetch with its own haves: %+v", rec)
	}

	// A deleted branch: the same request for its commit is refused, as
	// git refuses it, once the commit is gone; never replayed.
	doomed := s.env.RevParse(bare, "branch0")
	fetchDoomed := func() (string, error) {
		settle(t, bare)
		e := filepath.Join(t.TempDir(), "e")
		s.env.Git("", "init", "-q", e)
		return s.env.Run(e, v2, "fetch", "-q", url, doomed)
	}
	seq = s.lastSeq(t)
	for i := 0; i < 2; i++ {
		if out, err := fetchDoomed(); err != nil {
			t.Fatal(err, out)
		}
	}
	if got := outcomeCounts(s.fetchRecords(t, seq, "full-clone", 2)); got["generated/ok"] != 1 || got["replayed/ok"] != 1 {
		t.Fatalf("fetches of a branch's commit: %v", got)
	}
	s.env.Git(bare, "update-ref", "-d", "refs/heads/branch0")
	s.env.Git(bare, "repack", "-adq")
	s.env.Git(bare, "prune", "--expire=now")
	seq = s.lastSeq(t)
	out, err := fetchDoomed()
	if err == nil || !strings.Contains(out, "not our ref") {
		t.Fatalf("fetch of a deleted branch's commit: %v %s", err, out)
	}
	rec = s.fetchRecords(t, seq, "full-clone", 1)[0]
	// Refused by packwire before git (internal/reach), never replayed.
	if rec.PackCache == fetchcache.Replayed || rec.Result != governor.ResultRefused || !strings.Contains(rec.Error, "not our ref") {
		t.Fatalf("fetch of a deleted branch's commit: %+v", rec)
	}
}

// TestFetchCacheFollowsRefChanges: one fetch body whose answer depends on
// the refs beyond its wants (include-tag: annotated tags pointing into the
// pack come along) is sent again and again while tags are added, at delays
// around repostate.RacyWindow. Every answer has every tag made before it
// was asked for: a ref change makes the next identical request a miss,
// also when the stored answer's stamp was taken in the change's clock tick.
// Stored answers are replayed in between, so the replay path is exercised.
func TestFetchCacheFollowsRefChanges(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	bare := s.seed(t, "team/app")
	main := s.env.RevParse(bare, "main")
	var body bytes.Buffer
	pktline.Write(&body, []byte("command=fetch\n"))
	pktline.Write(&body, []byte("object-format=sha1\n"))
	body.WriteString("0001")
	for _, arg := range []string{"want " + main, "include-tag", "ofs-delta", "no-progress", "done"} {
		pktline.Write(&body, []byte(arg+"\n"))
	}
	pktline.WriteFlush(&body)
	objects := func() uint32 {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, s.httpURL("team/app")+"/git-upload-pack", bytes.NewReader(body.Bytes()))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-git-upload-pack-request")
		req.Header.Set("Git-Protocol", "version=2")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return packObjects(t, resp.Body)
	}

	settle(t, bare)
	base := objects()
	seq := s.lastSeq(t)
	w := repostate.RacyWindow
	delays := []time.Duration{0, w / 2, w - 5*time.Millisecond, w, w + 5*time.Millisecond, 2 * w}
	tags := 0
	for round := 0; round < 2; round++ {
		for _, d := range delays {
			tags++
			s.env.Git(bare, "tag", "-a", "-m", "tag", fmt.Sprintf("t%d", tags), main)
			time.Sleep(d)
			for try := 0; try < 3; try++ {
				if got, want := objects(), base+uint32(tags); got != want {
					t.Fatalf("tag %d, asked %v after it (try %d): %d objects, want %d (a stale answer)", tags, d, try, got, want)
				}
			}
		}
	}
	got := outcomeCounts(s.fetchRecords(t, seq, "full-clone", 3*tags))
	if got["generated/ok"] == 0 || got["replayed/ok"] == 0 {
		t.Fatalf("outcomes %v: the cache was not exercised", got)
	}
}

// packObjects reads a v2 fetch response without progress and returns the
// object count of its pack.
func packObjects(t *testing.T, r io.Reader) uint32 {
	t.Helper()
	pr := pktline.NewReader(r)
	inPack := false
	var pack []byte
	for len(pack) < 12 {
		kind, payload, err := pr.Read()
		if err != nil {
			t.Fatalf("reading the response: %v", err)
		}
		switch {
		case kind != pktline.Data:
		case !inPack:
			inPack = string(payload) == "packfile\n"
		case len(payload) > 0 && payload[0] == 1:
			pack = append(pack, payload[1:]...)
		}
	}
	if string(pack[:4]) != "PACK" {
		t.Fatalf("no pack header: %q", pack)
	}
	return binary.BigEndian.Uint32(pack[8:12])
}

// slowRepo creates a repository whose pack takes git a second or more to
// make: 16 MiB of incompressible blobs stored loose (fast-import keeps
// small imports loose), so pack-objects must compress each and search for
// deltas rather than reuse a pack, while the clients of a test gather
// around the run. The import itself neither compresses nor tries deltas
// (0.6 s of CPU, 2.7 s with them): the blobs are stored loose and
// uncompressed, which leaves pack-objects the same work.
func (s *testServer) slowRepo(t *testing.T, name string) string {
	t.Helper()
	r, err := s.Data.Repos.Create(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	var in bytes.Buffer
	fmt.Fprintf(&in, "commit refs/heads/main\ncommitter Test <test@example.com> 1767225600 +0000\ndata 4\nslow\n")
	rng := rand.New(rand.NewPCG(9, 9))
	blob := make([]byte, 1<<20)
	for f := 0; f < 16; f++ {
		for i := 0; i < len(blob); i += 8 {
			binary.LittleEndian.PutUint64(blob[i:], rng.Uint64())
		}
		fmt.Fprintf(&in, "M 100644 inline f%d\ndata %d\n", f, len(blob))
		in.Write(blob)
		in.WriteByte('\n')
	}
	cmd := exec.Command("git", "-c", "pack.compression=0", "-c", "core.looseCompression=0", "-c", "core.bigFileThreshold=32k", "fast-import", "--quiet")
	cmd.Dir, cmd.Stdin, cmd.Env = r.Path, &in, s.env.Vars
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatal(err, string(out))
	}
	if packs, _ := filepath.Glob(filepath.Join(r.Path, "objects", "pack", "*.pack")); len(packs) > 0 {
		t.Fatalf("fast-import wrote a pack, not loose objects: %v", packs)
	}
	s.env.Git(r.Path, "symbolic-ref", "HEAD", "refs/heads/main")
	settle(t, r.Path)
	return r.Path
}

// answerOnlyRepo is slowRepo for a test that needs its 16 MiB answer but
// not the second of git's delta search before the first byte: with
// pack.window=0 pack-objects only compresses as it writes (0.7 s of CPU
// a pack, not 3.5 s; the same bytes).
func (s *testServer) answerOnlyRepo(t *testing.T, name string) string {
	t.Helper()
	bare := s.slowRepo(t, name)
	s.env.Git(bare, "config", "pack.window", "0")
	settle(t, bare)
	return bare
}

// startClone starts "git clone -q --bare ARGS url" in the background.
func (s *testServer) startClone(t *testing.T, url string, args ...string) (*exec.Cmd, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "c")
	cmd := exec.Command("git", append(append([]string{"clone", "-q", "--bare"}, args...), url, dir)...)
	cmd.Env = append(append([]string{}, s.env.Vars...), v2...)
	// Its own process group: killing the clone must take its HTTP helper
	// (git-remote-http, which holds the connection) along.
	if err := procgroup.Start(cmd); err != nil {
		t.Fatal(err)
	}
	return cmd, dir
}

// hangUp kills a clone started by startClone, helper included.
func hangUp(cmd *exec.Cmd) {
	procgroup.Kill(cmd)
	cmd.Wait()
}

// waitStats waits until the fetch cache's state satisfies ok.
func (s *testServer) waitStats(t *testing.T, what string, ok func(fetchcache.Stats) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := s.Pipeline.FetchCache.Stats()
		if ok(st) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("fetch cache never had %s: %+v", what, st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestFetchCacheClientsLeave: while git runs for a herd, the leader's
// client and a follower hang up; git keeps going for the others, who get
// good clones, and its response is stored. When the only reader of a run
// leaves, git is killed and nothing is stored.
func TestFetchCacheClientsLeave(t *testing.T) {
	t.Parallel() // it counts its own server's gits only (s.children)
	s := startServer(t, nil)
	s.slowRepo(t, "slow")
	url := s.httpURL("slow")
	seq := s.lastSeq(t)

	started := time.Now()
	leader, _ := s.startClone(t, url)
	s.waitStats(t, "a run", func(st fetchcache.Stats) bool { return st.Runs == 1 })
	var followers []*exec.Cmd
	var dirs []string
	for i := 0; i < 3; i++ {
		cmd, dir := s.startClone(t, url)
		followers, dirs = append(followers, cmd), append(dirs, dir)
	}
	s.waitStats(t, "four readers of one run", func(st fetchcache.Stats) bool {
		if st.Runs == 0 {
			t.Fatalf("git finished in %v, before the herd gathered: make the repository slower", time.Since(started))
		}
		return st.Runs == 1 && st.Readers == 4
	})
	hangUp(leader)
	hangUp(followers[0])
	if st := s.Pipeline.FetchCache.Stats(); st.Runs != 1 {
		t.Fatalf("the run stopped when its leader left: %+v (after %v)", st, time.Since(started))
	}
	for i, cmd := range followers[1:] {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("follower %d broke when others left: %v", i+1, err)
		}
		s.env.Fsck(dirs[i+1])
	}
	recs := s.fetchRecords(t, seq, "full-clone", 4)
	if got := outcomeCounts(recs); got["generated/client-gone"] != 1 || got["replayed/client-gone"] != 1 || got["replayed/ok"] != 2 {
		t.Fatalf("outcomes %v", got)
	}
	for _, rec := range recs {
		if rec.PackCache == fetchcache.Generated && rec.CPU() == 0 {
			t.Fatalf("the leader's record has no git cost: %+v", rec)
		}
	}
	// git finished after its leader left: the response is stored.
	seq = s.lastSeq(t)
	cmd, dir := s.startClone(t, url)
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	s.env.Fsck(dir)
	if rec := s.fetchRecords(t, seq, "full-clone", 1)[0]; rec.PackCache != fetchcache.Replayed {
		t.Fatalf("clone after the run: %+v", rec)
	}

	// A run whose only reader leaves is stopped (another request: a new key).
	before := s.Pipeline.FetchCache.Stats()
	seq = s.lastSeq(t)
	lone, _ := s.startClone(t, url, "--depth", "1")
	s.waitStats(t, "a run with its git", func(st fetchcache.Stats) bool { return st.Runs == 1 && len(s.childPIDs("upload-pack")) == 1 })
	hangUp(lone)
	s.waitNoChildren(t, "upload-pack", 2*time.Second)
	s.waitStats(t, "no run", func(st fetchcache.Stats) bool { return st.Runs == 0 })
	if st := s.Pipeline.FetchCache.Stats(); st.Entries != before.Entries {
		t.Fatalf("after its only reader left: %+v (before %+v)", st, before)
	}
	if rec := s.fetchRecords(t, seq, "shallow-clone", 1)[0]; rec.PackCache != fetchcache.Generated || rec.Result != governor.ResultClientGone {
		t.Fatalf("abandoned run: %+v", rec)
	}
}

// childPIDs lists the pids of s.children(match).
func (s *testServer) childPIDs(match string) []int {
	var pids []int
	for _, c := range s.children(match) {
		pids = append(pids, c.pid)
	}
	return pids
}

// TestFetchCacheLeaderFails: the leader's git dies before the pack flows;
// the followers, which have sent nothing yet (HoldBack), run git
// themselves and get good clones.
func TestFetchCacheLeaderFails(t *testing.T) {
	t.Parallel() // it counts its own server's gits only (s.children)
	s := startServer(t, nil)
	s.slowRepo(t, "slow")
	url := s.httpURL("slow")
	seq := s.lastSeq(t)

	leader, _ := s.startClone(t, url)
	s.waitStats(t, "a run", func(st fetchcache.Stats) bool { return st.Runs == 1 })
	var followers []*exec.Cmd
	var dirs []string
	for i := 0; i < 2; i++ {
		cmd, dir := s.startClone(t, url)
		followers, dirs = append(followers, cmd), append(dirs, dir)
	}
	s.waitStats(t, "three readers, nothing sent to followers yet", func(st fetchcache.Stats) bool {
		if st.Runs == 0 || st.RunBytes >= fetchcache.HoldBack {
			t.Fatalf("git got too far before the herd gathered: %+v", st)
		}
		return st.Readers == 3
	})
	pids := s.childPIDs("upload-pack")
	if len(pids) != 1 {
		t.Fatalf("upload-pack processes: %v", pids)
	}
	p, err := os.FindProcess(pids[0])
	if err != nil {
		t.Fatal(err)
	}
	procgroup.Kill(&exec.Cmd{Process: p}) // its process group: pack-objects too
	if err := leader.Wait(); err == nil {
		t.Fatal("the leader's clone succeeded without its git")
	}
	for i, cmd := range followers {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("follower %d failed with its leader: %v", i, err)
		}
		s.env.Fsck(dirs[i])
	}
	got := outcomeCounts(s.fetchRecords(t, seq, "full-clone", 3))
	if got["generated/git-error"] != 1 || got["/ok"] != 2 {
		t.Fatalf("outcomes %v", got)
	}
}

// TestFetchCacheBounds: with too little free disk the cache stands aside,
// over its size bound it shares runs but keeps nothing; clones work.
func TestFetchCacheBounds(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		mutate  func(*Config)
		outcome string
	}{
		{"disk full", func(c *Config) { c.FetchCacheMinFreeBytes = 1 << 62 }, ""},
		{"over budget", func(c *Config) { c.FetchCacheMaxBytes = 100 }, fetchcache.Generated},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := startServer(t, c.mutate)
			bare := s.seed(t, "app")
			settle(t, bare)
			seq := s.lastSeq(t)
			for i := 0; i < 2; i++ {
				dir := filepath.Join(t.TempDir(), "c")
				if out, err := s.env.Run("", v2, "clone", "-q", "--bare", s.httpURL("app"), dir); err != nil {
					t.Fatal(err, out)
				}
				s.env.Fsck(dir)
			}
			for _, rec := range s.fetchRecords(t, seq, "full-clone", 2) {
				if rec.PackCache != c.outcome || rec.CPU() == 0 || rec.Result != governor.ResultOK {
					t.Fatalf("%+v", rec)
				}
			}
			if files, _ := os.ReadDir(s.Pipeline.FetchCache.Dir); len(files) != 0 {
				t.Fatalf("files in the cache: %v", files)
			}
		})
	}
}

// TestShutdownWithStuckReplay: a client asks for a stored response and
// never reads it, so the replay's sendfile blocks; Shutdown still ends
// within its grace period.
func TestShutdownWithStuckReplay(t *testing.T) {
	s := startServer(t, nil)
	bare := s.bigRepo(t, "big")
	head := s.env.RevParse(bare, "main")
	settle(t, bare)
	var body []byte
	for _, l := range []string{"command=fetch\n", "|", "want " + head + "\n", "ofs-delta\n", "done\n", ""} {
		switch l {
		case "|":
			body = append(body, "0001"...)
		case "":
			body = append(body, "0000"...)
		default:
			body, _ = pktline.Append(body, []byte(l))
		}
	}
	post := func() *http.Response {
		req, _ := http.NewRequest("POST", "http://"+s.HTTPAddr.String()+"/big/git-upload-pack", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/x-git-upload-pack-request")
		req.Header.Set("Git-Protocol", "version=2")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := post() // generates and stores
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if n < 40<<20 || s.Pipeline.FetchCache.Stats().Entries != 1 {
		t.Fatalf("first response %d bytes, cache %+v", n, s.Pipeline.FetchCache.Stats())
	}

	conn, err := net.Dial("tcp", s.HTTPAddr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /big/git-upload-pack HTTP/1.1\r\nHost: x\r\nGit-Protocol: version=2\r\nContent-Type: application/x-git-upload-pack-request\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	time.Sleep(500 * time.Millisecond) // the replay fills the socket buffers and blocks
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	done := make(chan struct{})
	go func() { s.Shutdown(ctx); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		conn.Close()
		<-done
		t.Fatal("shutdown still blocked 3s into a 500ms grace period by a replay nobody reads")
	}
}
