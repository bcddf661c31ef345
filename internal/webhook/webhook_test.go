package webhook

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"packwire/internal/outbox"
)

// The signature is GitHub's X-Hub-Signature-256 scheme: its documented
// example must come out the same.
func TestSignMatchesGitHubsExample(t *testing.T) {
	const want = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
	if got := Sign("It's a Secret to Everybody", []byte("Hello, World!")); got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
	if !Verify("It's a Secret to Everybody", []byte("Hello, World!"), want) || Verify("other", []byte("Hello, World!"), want) {
		t.Fatal("Verify")
	}
}

func TestCheckURLAndEvents(t *testing.T) {
	for _, ok := range []string{"http://127.0.0.1:9/x", "https://hooks.example.com/a?b=c"} {
		if err := CheckURL(ok); err != nil {
			t.Errorf("CheckURL(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"ftp://example.com/", "file:///etc/passwd", "gopher://x", "http:///nohost", "javascript:alert(1)", "example.com/hook"} {
		if err := CheckURL(bad); err == nil {
			t.Errorf("CheckURL(%q) accepted", bad)
		}
	}
	if evs, err := ParseEvents(""); err != nil || len(evs) != 3 {
		t.Fatalf("default events: %v %v", evs, err)
	}
	if _, err := ParseEvents("push,tag"); err == nil {
		t.Fatal("an unknown event was accepted")
	}
	// *** as written: url.User would print it as %2A%2A%2A (the old code).
	for raw, want := range map[string]string{
		"https://u:p@h.example/x?token=t#f": "https://***@h.example/x?***",
		"http://tok@h.example:8080/in":      "http://***@h.example:8080/in",
		"https://h.example/x":               "https://h.example/x",
	} {
		if got := RedactURL(raw); got != want {
			t.Errorf("RedactURL(%s) = %s, want %s", raw, got, want)
		}
	}
}

// A push that writes and deletes refs makes one push payload and one
// ref-delete payload, each ref in exactly one of them.
func TestPayloadsSplitDeletions(t *testing.T) {
	zero := strings.Repeat("0", 40)
	a, b := strings.Repeat("a", 40), strings.Repeat("b", 40)
	ev := outbox.Event{Type: outbox.RefsChanged, Repo: "team/app", User: "", Transport: "ssh", Time: time.Unix(1, 0),
		Refs: []outbox.RefUpdate{{Ref: "refs/heads/main", Old: a, New: b}, {Ref: "refs/heads/gone", Old: a, New: zero}, {Ref: "refs/tags/v1", Old: zero, New: b}}}
	ps := Payloads(ev)
	if len(ps) != 2 {
		t.Fatalf("%d payloads", len(ps))
	}
	push, del := ps[EventPush], ps[EventRefDelete]
	if push.Pusher != "anonymous" || len(push.Refs) != 2 || !push.Refs[1].Created || push.Refs[0].Created || push.Refs[0].Deleted {
		t.Fatalf("push payload: %+v", push)
	}
	if len(del.Refs) != 1 || !del.Refs[0].Deleted || del.Refs[0].Name != "refs/heads/gone" || del.Event != EventRefDelete {
		t.Fatalf("ref-delete payload: %+v", del)
	}
	body, _ := json.Marshal(del)
	for _, field := range []string{`"event":"ref-delete"`, `"repository":"team/app"`, `"pusher":"anonymous"`, `"transport":"ssh"`, `"old":"aaaa`, `"new":"0000`} {
		if !strings.Contains(string(body), field) {
			t.Errorf("payload lacks %s: %s", field, body)
		}
	}
	if ps := Payloads(outbox.Event{Type: outbox.RefsChanged, Repo: "m", Transport: "mirror", Refs: ev.Refs[:1]}); ps[EventPush].Pusher != "" {
		t.Fatalf("a mirror's sync names a pusher: %+v", ps[EventPush])
	}
}
