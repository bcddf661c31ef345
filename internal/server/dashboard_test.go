package server

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// The dashboard owns every path under /-/ (whatever the method), git keeps
// the rest, and no repository can sit under /-/.
func TestDashboardRoutes(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	s.seed(t, "team/app")
	base := "http://" + s.HTTPAddr.String()
	get := func(method, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, nil)
		client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("GET", "/-/now"); code != 401 || !strings.Contains(body, `action="/-/login"`) {
		t.Fatalf("/-/now: HTTP %d\n%s", code, body)
	}
	// The dashboard refuses a POST that no page of its own sent.
	if code, body := get("POST", "/-/git-upload-pack"); code != 403 || !strings.Contains(body, "cross-origin request refused") {
		t.Fatalf("POST under /-/: HTTP %d %s", code, body)
	}
	if code, _ := get("GET", "/-/info/refs?service=git-upload-pack"); code != 401 {
		t.Fatalf("/-/info/refs: HTTP %d", code)
	}
	if code, _ := get("GET", "/-"); code != http.StatusMovedPermanently {
		t.Fatalf("/-: HTTP %d", code)
	}
	if code, body := get("GET", "/team/app.git/info/refs?service=git-upload-pack"); code != 200 || !strings.Contains(body, "refs/heads/main") {
		t.Fatalf("git beside the dashboard: HTTP %d\n%s", code, body)
	}
	if code, _ := get("GET", "/metrics"); code != 401 { // needs a metrics token (TestMetricsEndpoint)
		t.Fatalf("/metrics: HTTP %d", code)
	}
}
