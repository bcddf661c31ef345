package server

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"packwire/internal/governor"
)

// TestMalformedV2FetchErrors: a v2 fetch that git refuses (a negative
// deepen, a bad filter, want-ref, which is not offered) gets an error
// status with git's reason, with and without the fetch cache, never a 200
// with an empty body.
func TestMalformedV2FetchErrors(t *testing.T) {
	t.Parallel()
	for _, cache := range []bool{true, false} {
		t.Run(fmt.Sprintf("fetch-cache=%v", cache), func(t *testing.T) {
			s := startServer(t, func(c *Config) { c.FetchCache = cache })
			bare := s.seed(t, "team/app")
			head := s.env.RevParse(bare, "HEAD")
			settle(t, bare) // else the fetch cache stands aside for a racy stamp
			cases := []struct {
				args []string
				want string
			}{
				{[]string{"want " + head, "deepen -1"}, "Invalid deepen"},
				{[]string{"want " + head, "filter tree:-1"}, "expected 'tree:<depth>'"},
				{[]string{"want-ref refs/heads/main"}, "unexpected line: 'want-ref refs/heads/main'"},
			}
			for _, c := range cases {
				body := pkts(append(append([]string{"command=fetch", "agent=test", "DELIM"}, c.args...), "done", "")...)
				for i := 0; i < 2; i++ { // the second would be a replay, were anything kept
					req, _ := http.NewRequest("POST", fmt.Sprintf("http://%s/team/app/git-upload-pack", s.HTTPAddr), bytes.NewReader(body))
					req.Header.Set("Content-Type", "application/x-git-upload-pack-request")
					req.Header.Set("Git-Protocol", "version=2")
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						t.Fatal(err)
					}
					text, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(text), c.want) {
						t.Fatalf("%v (try %d): %s %q, want 400 with %q", c.args, i, resp.Status, text, c.want)
					}
				}
			}
		})
	}
}

// TestRefusedRecordsNameNoRepository: requests for repositories that do not
// resolve are recorded under no repository, with the path in the error,
// so arbitrary client strings never appear as repositories; an HTTP
// authentication challenge is recorded as a challenge, not an error.
func TestRefusedRecordsNameNoRepository(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	s.seed(t, "team/app")
	s.Data.Access.Store.SetSetting(t.Context(), "anonymous-read", "off")
	seq := s.lastSeq(t)
	for _, path := range []string{"/no/such/repo", "/<script>alert(1)</script>", "/team/app"} {
		resp, err := http.Get(fmt.Sprintf("http://%s%s/info/refs?service=git-upload-pack", s.HTTPAddr, path))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	recs := s.recordsAfter(t, seq, func(r []governor.Record) bool { return len(r) >= 3 })
	for _, r := range recs {
		if r.Repo != "" && r.Repo != "team/app" {
			t.Errorf("refusal recorded under repository %q", r.Repo)
		}
		if r.Result != governor.ResultChallenged {
			t.Errorf("401 challenge recorded as %q", r.Result)
		}
	}
}
