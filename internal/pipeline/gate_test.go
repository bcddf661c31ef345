package pipeline

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"packwire/internal/gitexec"
	"packwire/internal/pktline"
	"packwire/internal/protocol"
)

// TestAdmissionGateRefuses: a refused session gets git's ERR line, git's
// stdin ends before the want, and git's stderr goes quiet.
func TestAdmissionGateRefuses(t *testing.T) {
	busy := &Error{Code: CodeUnavailable, Message: "server busy: waited 1s in the queue for team/app; retry in 1s"}
	var in bytes.Buffer
	pktline.Write(&in, []byte("command=ls-refs\n"))
	pktline.WriteFlush(&in)
	lsRefs := in.Len()
	pktline.Write(&in, []byte("command=fetch\n"))
	pktline.WriteFlush(&in)
	stream := in.Bytes()
	var client bytes.Buffer
	admits := 0
	classifier := protocol.NewClassifier(gitexec.UploadPack, true)
	g := newAdmissionGate(io.MultiReader(bytes.NewReader(stream[:lsRefs]), bytes.NewReader(stream[lsRefs:])), classifier, classifier,
		func() error { admits++; return busy }, &client)
	passed, err := io.ReadAll(g)
	if !errors.Is(err, busy) || g.Refusal() != busy || admits != 1 {
		t.Fatalf("err %v, refusal %v, %d admissions", err, g.Refusal(), admits)
	}
	if strings.Contains(string(passed), "command=fetch") || !strings.Contains(string(passed), "command=ls-refs") {
		t.Fatalf("git was given %q", passed)
	}
	if want := "ERR " + busy.Message; !strings.Contains(client.String(), want) {
		t.Fatalf("client got %q, want an ERR pkt-line %q", client.String(), want)
	}
	var stderr bytes.Buffer
	q := quietAfterRefusal{w: &stderr, refused: g.refusedC}
	q.Write([]byte("fatal: the remote end hung up unexpectedly\n"))
	if stderr.Len() != 0 {
		t.Fatalf("git's stderr after a refusal: %q", stderr.String())
	}
}
