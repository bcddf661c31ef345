package dashboard_test

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"packwire/internal/needs"
)

// browser is headless Chromium driven over the DevTools protocol on a pipe
// (--remote-debugging-pipe: commands on fd 3, answers and events on fd 4,
// NUL-separated JSON), so the tests need no module and no port.
type browser struct {
	t          *testing.T
	cmd        *exec.Cmd
	toChrome   *os.File
	netLogPath string
	stderr     *strings.Builder

	mu      sync.Mutex
	nextID  int
	pending map[int]chan cdpMessage
	events  []cdpMessage // every event, in order
	changed chan struct{}
	closed  chan struct{}
}

type cdpMessage struct {
	ID        int             `json:"id,omitempty"`
	Method    string          `json:"method,omitempty"`
	Params    json.RawMessage `json:"params,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	SessionID string          `json:"sessionId,omitempty"`
	Error     *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

// chromiumPath finds Debian's chromium; a missing browser fails the test.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	needs.Missing(t, "chromium is not installed: run scripts/install-deps (as root it runs apt-get install -y chromium)")
	return ""
}

func startBrowser(t *testing.T) *browser {
	t.Helper()
	dir := t.TempDir()
	b := &browser{t: t, pending: map[int]chan cdpMessage{}, changed: make(chan struct{}), closed: make(chan struct{}),
		netLogPath: filepath.Join(dir, "netlog.json"), stderr: &strings.Builder{}}
	cmdR, cmdW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	b.cmd = exec.Command(chromiumPath(t), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-default-apps",
		"--disable-extensions", "--no-default-browser-check", "--disable-client-side-phishing-detection",
		"--enable-automation", "--password-store=basic", "--use-mock-keychain", "--metrics-recording-only",
		"--disable-features=Translate,OptimizationHints,MediaRouter,AutofillServerCommunication,NetworkTimeServiceQuerying",
		// Chromium's own services (sign-in, component updates) still ask for
		// their URLs whatever the flags: no name resolves but 127.0.0.1, so
		// none of them can connect anywhere. The net log check proves it.
		"--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
		"--user-data-dir="+filepath.Join(dir, "profile"), "--remote-debugging-pipe", "--log-net-log="+b.netLogPath,
		"--net-log-capture-mode=Default", "about:blank")
	b.cmd.ExtraFiles = []*os.File{cmdR, outW} // fd 3, fd 4
	b.cmd.Stderr = &lockedWriter{b: b.stderr}
	b.cmd.Env = append(os.Environ(), "HOME="+dir)
	if err := b.cmd.Start(); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	cmdR.Close()
	outW.Close()
	b.toChrome = cmdW
	go b.read(outR)
	t.Cleanup(b.close)
	return b
}

type lockedWriter struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (b *browser) read(f *os.File) {
	defer close(b.closed)
	r := bufio.NewReaderSize(f, 1<<20)
	for {
		raw, err := r.ReadBytes(0)
		if err != nil {
			return
		}
		var m cdpMessage
		if json.Unmarshal(raw[:len(raw)-1], &m) != nil {
			continue
		}
		b.mu.Lock()
		if m.ID != 0 {
			if ch := b.pending[m.ID]; ch != nil {
				ch <- m
				delete(b.pending, m.ID)
			}
		} else {
			b.events = append(b.events, m)
			close(b.changed)
			b.changed = make(chan struct{})
		}
		b.mu.Unlock()
	}
}

// close ends Chromium (Browser.close lets it finish the net log).
func (b *browser) close() {
	done := make(chan error, 1)
	go func() { done <- b.cmd.Wait() }()
	b.call("", "Browser.close", nil)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		b.cmd.Process.Kill()
		<-done
	}
	b.toChrome.Close()
}

// call sends one command (to a page when session is set) and returns its result.
func (b *browser) call(session, method string, params any) (json.RawMessage, error) {
	b.mu.Lock()
	b.nextID++
	id := b.nextID
	ch := make(chan cdpMessage, 1)
	b.pending[id] = ch
	b.mu.Unlock()
	msg := map[string]any{"id": id, "method": method, "params": params}
	if params == nil {
		msg["params"] = map[string]any{}
	}
	if session != "" {
		msg["sessionId"] = session
	}
	raw, _ := json.Marshal(msg)
	if _, err := b.toChrome.Write(append(raw, 0)); err != nil {
		return nil, fmt.Errorf("%s: %w", method, err)
	}
	select {
	case m := <-ch:
		if m.Error != nil {
			return nil, fmt.Errorf("%s: %s", method, m.Error.Message)
		}
		return m.Result, nil
	case <-b.closed:
		return nil, fmt.Errorf("%s: chromium exited: %s", method, b.stderr.String())
	case <-time.After(30 * time.Second):
		return nil, fmt.Errorf("%s: no answer in 30 s", method)
	}
}

func (b *browser) must(session, method string, params any) json.RawMessage {
	b.t.Helper()
	res, err := b.call(session, method, params)
	if err != nil {
		b.t.Fatal(err)
	}
	return res
}

// tab is one page target with its own session.
type tab struct {
	b       *browser
	session string
}

// newTab opens a page in a browser context of its own (its own cookies).
func (b *browser) newTab() *tab {
	b.t.Helper()
	var ctx struct{ BrowserContextID string }
	json.Unmarshal(b.must("", "Target.createBrowserContext", nil), &ctx)
	var target struct{ TargetID string }
	json.Unmarshal(b.must("", "Target.createTarget", map[string]any{"url": "about:blank", "browserContextId": ctx.BrowserContextID}), &target)
	var att struct{ SessionID string }
	json.Unmarshal(b.must("", "Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}), &att)
	tb := &tab{b: b, session: att.SessionID}
	for _, domain := range []string{"Page", "Runtime", "Log", "Network"} {
		b.must(tb.session, domain+".enable", nil)
	}
	b.must(tb.session, "Emulation.setDeviceMetricsOverride", map[string]any{"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": false})
	return tb
}

// eventsSince returns the tab's events from index i on, and the next index.
func (tb *tab) eventsSince(i int) ([]cdpMessage, int) {
	tb.b.mu.Lock()
	defer tb.b.mu.Unlock()
	var out []cdpMessage
	for _, e := range tb.b.events[i:] {
		if e.SessionID == tb.session {
			out = append(out, e)
		}
	}
	return out, len(tb.b.events)
}

func (tb *tab) mark() int {
	tb.b.mu.Lock()
	defer tb.b.mu.Unlock()
	return len(tb.b.events)
}

// waitLoad waits for the page's load event after event index since.
func (tb *tab) waitLoad(since int) {
	tb.b.t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		tb.b.mu.Lock()
		changed := tb.b.changed
		tb.b.mu.Unlock()
		evs, _ := tb.eventsSince(since)
		for _, e := range evs {
			if e.Method == "Page.loadEventFired" {
				return
			}
		}
		select {
		case <-changed:
		case <-deadline:
			tb.b.t.Fatal("page did not load in 30 s")
		}
	}
}

// navigate loads url and waits for its load event; it returns the HTTP
// status of the document.
func (tb *tab) navigate(url string) int {
	tb.b.t.Helper()
	since := tb.mark()
	tb.b.must(tb.session, "Page.navigate", map[string]any{"url": url})
	tb.waitLoad(since)
	return tb.documentStatus(since)
}

// documentStatus is the status of the last document response after since.
func (tb *tab) documentStatus(since int) int {
	evs, _ := tb.eventsSince(since)
	status := 0
	for _, e := range evs {
		if e.Method != "Network.responseReceived" {
			continue
		}
		var p struct {
			Type     string
			Response struct{ Status int }
		}
		json.Unmarshal(e.Params, &p)
		if p.Type == "Document" {
			status = p.Response.Status
		}
	}
	return status
}

// eval runs a JavaScript expression in the page and decodes its value into out.
func (tb *tab) eval(expr string, out any) {
	tb.b.t.Helper()
	res := tb.b.must(tb.session, "Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true, "awaitPromise": true})
	var r struct {
		Result struct {
			Value json.RawMessage
		}
		ExceptionDetails *struct{ Text string }
	}
	json.Unmarshal(res, &r)
	if r.ExceptionDetails != nil {
		tb.b.t.Fatalf("evaluating %s: %s", expr, r.ExceptionDetails.Text)
	}
	if out != nil {
		if err := json.Unmarshal(r.Result.Value, out); err != nil {
			tb.b.t.Fatalf("evaluating %s: %v (%s)", expr, err, r.Result.Value)
		}
	}
}

// text is the page's visible text.
func (tb *tab) text() string {
	var s string
	tb.eval("document.body.innerText", &s)
	return s
}

// screenshot saves the whole page as a PNG.
func (tb *tab) screenshot(path string) {
	tb.b.t.Helper()
	var m struct {
		CSSContentSize struct{ Width, Height float64 }
	}
	json.Unmarshal(tb.b.must(tb.session, "Page.getLayoutMetrics", nil), &m)
	w, h := max(m.CSSContentSize.Width, 1280), min(max(m.CSSContentSize.Height, 600), 6000)
	res := tb.b.must(tb.session, "Page.captureScreenshot", map[string]any{"format": "png", "captureBeyondViewport": true,
		"clip": map[string]any{"x": 0, "y": 0, "width": w, "height": h, "scale": 1}})
	var shot struct{ Data string }
	json.Unmarshal(res, &shot)
	png, err := base64.StdEncoding.DecodeString(shot.Data)
	if err != nil || len(png) == 0 {
		tb.b.t.Fatalf("screenshot: %v", err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		tb.b.t.Fatal(err)
	}
}

// problems lists console errors, uncaught exceptions, error log entries
// (CSP violations, failed loads) and requests that left 127.0.0.1 since
// event index since.
func (tb *tab) problems(since int) []string {
	evs, _ := tb.eventsSince(since)
	var out []string
	for _, e := range evs {
		switch e.Method {
		case "Runtime.consoleAPICalled":
			var p struct {
				Type string
				Args []struct{ Value any }
			}
			json.Unmarshal(e.Params, &p)
			if p.Type == "error" || p.Type == "assert" || p.Type == "warning" {
				out = append(out, fmt.Sprintf("console.%s: %v", p.Type, p.Args))
			}
		case "Runtime.exceptionThrown":
			out = append(out, "exception: "+string(e.Params))
		case "Log.entryAdded":
			var p struct {
				Entry struct{ Level, Text, URL string }
			}
			json.Unmarshal(e.Params, &p)
			if p.Entry.Level == "error" || p.Entry.Level == "warning" {
				out = append(out, fmt.Sprintf("log %s: %s (%s)", p.Entry.Level, p.Entry.Text, p.Entry.URL))
			}
		case "Network.requestWillBeSent":
			var p struct{ Request struct{ URL string } }
			json.Unmarshal(e.Params, &p)
			if !localURL(p.Request.URL) {
				out = append(out, "request left 127.0.0.1: "+p.Request.URL)
			}
		}
	}
	return out
}

// localURL accepts URLs that stay on this machine's loopback address, or
// carry their content in themselves.
func localURL(u string) bool {
	return strings.HasPrefix(u, "http://127.0.0.1:") || strings.HasPrefix(u, "ws://127.0.0.1:") ||
		strings.HasPrefix(u, "data:") || u == "about:blank" || strings.HasPrefix(u, "chrome-error://")
}

// netLogSummary is what Chromium's net log (written whole when the browser
// closes) says about the network: every URL asked for, whoever asked, and
// every address a TCP connection was attempted to or a UDP datagram sent to.
type netLogSummary struct {
	URLs      []string
	Connected []string // TCP connect attempts, "ip:port"
	UDPSends  int      // datagrams sent (QUIC and DNS are off: expected 0)
}

func (b *browser) readNetLog() (netLogSummary, error) {
	raw, err := os.ReadFile(b.netLogPath)
	if err != nil {
		return netLogSummary{}, err
	}
	var log struct {
		Constants struct {
			LogEventTypes map[string]int `json:"logEventTypes"`
		} `json:"constants"`
		Events []struct {
			Type   int            `json:"type"`
			Params map[string]any `json:"params"`
		} `json:"events"`
	}
	if err := json.Unmarshal(raw, &log); err != nil {
		return netLogSummary{}, fmt.Errorf("net log %s: %w", b.netLogPath, err)
	}
	name := map[int]string{}
	for k, v := range log.Constants.LogEventTypes {
		name[v] = k
	}
	var s netLogSummary
	for _, e := range log.Events {
		if u, ok := e.Params["url"].(string); ok {
			s.URLs = append(s.URLs, u)
		}
		switch name[e.Type] {
		case "TCP_CONNECT_ATTEMPT":
			if a, ok := e.Params["address"].(string); ok {
				s.Connected = append(s.Connected, a)
			}
		case "UDP_BYTES_SENT":
			s.UDPSends++
		}
	}
	return s, nil
}
