package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"packwire/internal/governor"
)

// CPUReader reads the cumulative CPU time of a server from outside it (a
// cgroup, a process tree). The bench samples it when a phase starts and
// ends and divides the difference by the operations completed.
type CPUReader interface {
	CPU() (time.Duration, error)
	String() string // where the figure comes from, for the report
}

// Governor reads packwire's request records over its lab API
// (GET /api/v1/requests), with a server admin's HTTP token.
type Governor struct {
	URL    string // base, e.g. http://host:8080
	Token  string
	Client *http.Client // nil: a client with a 30 s timeout
}

func (g *Governor) String() string { return "packwire governor at " + g.URL }

// GovernorURL is the http(s) base of a repository URL, or "" for other schemes.
func GovernorURL(repoURL string) string {
	u, err := url.Parse(repoURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return ""
	}
	return u.Scheme + "://" + u.Host
}

// page asks for the records written after the cursor that started at or
// after since.
func (g *Governor) page(ctx context.Context, since time.Time, after int64, limit int) (governor.APIPage, error) {
	q := url.Values{}
	q.Set("since", since.UTC().Format(time.RFC3339Nano))
	q.Set("after", fmt.Sprint(after))
	q.Set("limit", fmt.Sprint(limit))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(g.URL, "/")+"/api/v1/requests?"+q.Encode(), nil)
	if err != nil {
		return governor.APIPage{}, fmt.Errorf("governor URL %s: %w", g.URL, err)
	}
	req.SetBasicAuth("", g.Token)
	hc := g.Client
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return governor.APIPage{}, fmt.Errorf("governor at %s: %w", g.URL, err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusUnauthorized:
		return governor.APIPage{}, fmt.Errorf("the governor at %s wants a server admin's HTTP token (--token)", g.URL)
	case http.StatusForbidden:
		return governor.APIPage{}, fmt.Errorf("the governor at %s refused the token: it is not a server admin's (packwire grant USER admin '**')", g.URL)
	case http.StatusNotFound:
		return governor.APIPage{}, fmt.Errorf("no packwire governor at %s (404); for another server use --server-cgroup or --server-pid", g.URL)
	default:
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		return governor.APIPage{}, fmt.Errorf("governor at %s: %s: %s", g.URL, resp.Status, strings.TrimSpace(string(body)))
	}
	var p governor.APIPage
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
		return governor.APIPage{}, fmt.Errorf("governor at %s: unreadable answer: %w", g.URL, err)
	}
	return p, nil
}

// Probe checks that the governor answers and accepts the token.
func (g *Governor) Probe(ctx context.Context) error {
	_, err := g.page(ctx, time.Now(), 0, 1)
	return err
}

// Window returns the upload-pack records of requests that started within
// [from, to]. Records reach the governor's database in batches after each
// request ends, so it first waits settle past the window's end, then reads
// until a further read brings nothing new.
func (g *Governor) Window(ctx context.Context, from, to time.Time, settle time.Duration) ([]governor.Record, error) {
	if settle <= 0 {
		settle = 1200 * time.Millisecond
	}
	if wait := time.Until(to.Add(settle)); wait > 0 {
		if err := sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
	var (
		cursor int64
		recs   []governor.Record
	)
	deadline := time.Now().Add(30 * time.Second)
	for polls := 0; ; polls++ {
		added := 0
		for {
			p, err := g.page(ctx, from, cursor, 10_000)
			if err != nil {
				return nil, err
			}
			cursor = p.Next
			for _, r := range p.Records {
				if r.Start.After(to) {
					continue // a later request (another client of the server)
				}
				added++
				if r.Service == "git-upload-pack" && !r.Start.Before(from) {
					recs = append(recs, r)
				}
			}
			if len(p.Records) < 10_000 {
				break
			}
		}
		if polls > 0 && added == 0 || time.Now().After(deadline) {
			return recs, nil
		}
		if err := sleep(ctx, settle/3); err != nil {
			return nil, err
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// errNotSupported is returned by the cgroup and process readers off Linux.
var errNotSupported = errors.New("reading a server's CPU from a cgroup or /proc needs Linux")
