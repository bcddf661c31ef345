package server

import (
	"strings"
	"testing"

	"packwire/internal/governor"
)

// A v2 client's GET of info/refs is answered from the capabilities cache
// after the first one: no git process (no RSS recorded), the same bytes,
// and a fresh answer once the repository's config changes. Advertisements
// with a per-process session id are never cached.
func TestV2CapabilitiesCachedForHTTP(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	bare := s.seed(t, "caps")
	lsRemote := func() string {
		t.Helper()
		out, err := s.env.Run("", protocolEnv(2), "ls-remote", s.httpURL("caps"))
		if err != nil {
			t.Fatalf("ls-remote: %v\n%s", err, out)
		}
		assertProtocol(t, out, 2)
		return out
	}
	// capabilities returns the advertisement lines the client read, and
	// whether the GET that sent them ran git.
	capabilities := func() (string, bool) {
		t.Helper()
		seq := s.lastSeq(t)
		trace := lsRemote()
		recs := s.recordsAfter(t, seq, func(r []governor.Record) bool { return len(r) >= 2 })
		var get *governor.Record
		for i := range recs {
			if recs[i].Kind == "refs" && recs[i].BytesIn == 0 {
				get = &recs[i]
			}
		}
		if get == nil {
			t.Fatalf("no record of the GET info/refs among %+v", recs)
		}
		var lines []string
		for _, l := range strings.Split(trace, "\n") {
			i := strings.Index(l, "git< ")
			if i < 0 {
				continue
			}
			if line := l[i+5:]; line != "0000" && line != "0001" && line != "0002" && !strings.Contains(line, " refs/") {
				lines = append(lines, line)
			}
		}
		return strings.Join(lines, "\n"), get.MaxRSS > 0
	}

	first, ran := capabilities()
	if !ran || !strings.Contains(first, "version 2") {
		t.Fatalf("first GET: ran git %v, advertised:\n%s", ran, first)
	}
	second, ran := capabilities()
	if ran || second != first {
		t.Fatalf("second GET: ran git %v (want cached); advertised:\n%s\nfirst:\n%s", ran, second, first)
	}
	// A config change that changes the advertisement is seen at once.
	if !strings.Contains(first, "ls-refs=unborn") {
		t.Fatalf("expected ls-refs=unborn in git 2.39's advertisement:\n%s", first)
	}
	s.env.Git(bare, "config", "lsrefs.unborn", "ignore")
	third, ran := capabilities()
	if !ran || strings.Contains(third, "unborn") {
		t.Fatalf("after a config change: ran git %v, advertised:\n%s", ran, third)
	}
	// Session ids are per process: never served from the cache.
	s.env.Git(bare, "config", "transfer.advertiseSID", "true")
	for i := 0; i < 2; i++ {
		caps, ran := capabilities()
		if !ran || !strings.Contains(caps, "session-id=") {
			t.Fatalf("with advertiseSID, GET %d: ran git %v, advertised:\n%s", i, ran, caps)
		}
	}
	// Clones still work from the cached advertisement.
	s.env.Git(bare, "config", "--unset", "transfer.advertiseSID")
	capabilities()
	capabilities()
	dst := t.TempDir() + "/clone"
	if out, err := s.env.Run("", protocolEnv(2), "clone", "-q", s.httpURL("caps"), dst); err != nil {
		t.Fatalf("clone: %v\n%s", err, out)
	}
	s.env.Fsck(dst)
}
