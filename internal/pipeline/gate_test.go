package pipeline

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"packwire/internal/pktline"
)

func pkts(lines ...string) []byte {
	var b []byte
	for _, l := range lines {
		if l == "" {
			b = append(b, "0000"...)
			continue
		}
		if l == "DELIM" {
			b = append(b, "0001"...)
			continue
		}
		b, _ = pktline.Append(b, []byte(l+"\n"))
	}
	return b
}

// gateRun feeds stream to a gate in chunks, records what git was given at
// the moment of each admission, and returns what git got in all.
func gateRun(t *testing.T, v2 bool, stream []byte, admitErr error) (passed string, beforeAdmit []string, client string, err error) {
	return gateRunChecked(t, v2, stream, admitErr, nil)
}

func gateRunChecked(t *testing.T, v2 bool, stream []byte, admitErr error, check func([]string) error) (passed string, beforeAdmit []string, client string, err error) {
	t.Helper()
	var given bytes.Buffer
	var cl bytes.Buffer
	var g *admissionGate
	g = newAdmissionGate(bytes.NewReader(stream), io.Discard, v2, func() error {
		beforeAdmit = append(beforeAdmit, given.String())
		return admitErr
	}, check, &cl, Pace{}, func(error) {})
	buf := make([]byte, 7) // small reads: packets span several
	for {
		n, rerr := g.Read(buf)
		given.Write(buf[:n])
		if rerr != nil {
			if rerr != io.EOF {
				err = rerr
			}
			break
		}
	}
	return given.String(), beforeAdmit, cl.String(), err
}

const oidA = "1111111111111111111111111111111111111111"

// TestAdmissionGateV0: wants and haves reach git at once; the slot is
// taken at "done", which git sees only once admitted; ls-remote (a flush
// alone) takes none.
func TestAdmissionGateV0(t *testing.T) {
	stream := pkts("want "+oidA+" multi_ack_detailed side-band-64k", "", "have "+oidA, "", "done")
	passed, before, _, err := gateRun(t, false, stream, nil)
	if err != nil || passed != string(stream) {
		t.Fatalf("err %v, git got %q", err, passed)
	}
	if len(before) != 1 || strings.Contains(before[0], "done") || !strings.Contains(before[0], "have "+oidA) {
		t.Fatalf("admitted when git had %q", before)
	}
	if _, before, _, _ := gateRun(t, false, pkts(""), nil); len(before) != 0 {
		t.Fatal("ls-remote took a slot")
	}
	// no-done: the flush after haves may start a pack.
	stream = pkts("want "+oidA+" multi_ack_detailed no-done", "", "have "+oidA, "")
	if _, before, _, _ := gateRun(t, false, stream, nil); len(before) != 1 || strings.HasSuffix(before[0], "0000") && strings.Count(before[0], "0000") > 1 {
		t.Fatalf("no-done: admitted %d times, git had %q", len(before), before)
	}
}

// TestAdmissionGateV2: a fetch command is held whole and admitted at its
// flush; ls-refs passes; a refusal gives the client git's ERR line and git
// never sees the fetch.
func TestAdmissionGateV2(t *testing.T) {
	lsRefs := pkts("command=ls-refs", "DELIM", "peel", "")
	fetch := pkts("command=fetch", "agent=git/2.39", "DELIM", "want "+oidA, "done", "")
	stream := append(append([]byte(nil), lsRefs...), fetch...)
	passed, before, _, err := gateRun(t, true, stream, nil)
	if err != nil || passed != string(stream) || len(before) != 1 || before[0] != string(lsRefs) {
		t.Fatalf("err %v, admitted at %q, git got %q", err, before, passed)
	}
	busy := &Error{Code: CodeUnavailable, Message: "server busy: waited 1s in the queue for team/app; retry in 1s"}
	passed, _, client, err := gateRun(t, true, stream, busy)
	if !errors.Is(err, busy) || strings.Contains(passed, "command=fetch") || !strings.Contains(passed, "command=ls-refs") {
		t.Fatalf("refused: err %v, git got %q", err, passed)
	}
	if want := "ERR " + busy.Message; !strings.Contains(client, want) {
		t.Fatalf("client got %q, want an ERR pkt-line %q", client, want)
	}
}

// TestAdmissionGatePace: a v2 fetch command trickled slower than the pace
// is refused with a message, the request is cancelled, and it never took
// a slot.
func TestAdmissionGatePace(t *testing.T) {
	pr, pw := io.Pipe()
	defer pw.Close()
	var client bytes.Buffer
	admitted := false
	ctx, cancel := context.WithCancelCause(context.Background())
	g := newAdmissionGate(pr, io.Discard, true, func() error { admitted = true; return nil }, nil, &client,
		Pace{Grace: 300 * time.Millisecond, MinRate: 1000}, cancel)
	go func() {
		pw.Write(pkts("command=fetch"))
		rest := pkts("DELIM", "want "+oidA, "done", "")
		for i := 0; ctx.Err() == nil && i < len(rest); i++ {
			time.Sleep(50 * time.Millisecond)
			pw.Write(rest[i : i+1])
		}
		pw.CloseWithError(context.Cause(ctx))
	}()
	done := make(chan error, 1)
	go func() { _, err := io.ReadAll(g); done <- err }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("trickled request not cut off")
	}
	if !errors.Is(context.Cause(ctx), ErrTooSlow) || admitted {
		t.Fatalf("cause %v, admitted %v", context.Cause(ctx), admitted)
	}
	var perr *Error
	if !errors.As(g.Refusal(), &perr) || perr.Code != CodeTimeout || !strings.Contains(client.String(), "ERR request too slow") {
		t.Fatalf("refusal %v, client got %q", g.Refusal(), client.String())
	}
}

// TestAdmissionGateRefusedQuiet: git's complaint that its client hung up
// is dropped after a refusal.
func TestAdmissionGateRefusedQuiet(t *testing.T) {
	g := newAdmissionGate(bytes.NewReader(nil), io.Discard, true, nil, nil, io.Discard, Pace{}, func(error) {})
	g.refuse(errors.New("busy"))
	var stderr bytes.Buffer
	q := quietAfterRefusal{w: &stderr, refused: g.refusedC}
	q.Write([]byte("fatal: the remote end hung up unexpectedly\n"))
	if stderr.Len() != 0 {
		t.Fatalf("git's stderr after a refusal: %q", stderr.String())
	}
}

// TestAdmissionGateChecksWants: the wants reach the check before git sees
// them (v0: the want section is held to its flush; v2: inside the held
// fetch command); a refused want never reaches git and the client gets
// git's ERR line.
func TestAdmissionGateChecksWants(t *testing.T) {
	const oidB = "2222222222222222222222222222222222222222"
	notOurs := &Error{Code: CodeForbidden, Message: "upload-pack: not our ref " + oidB}
	check := func(lines []string) error {
		for _, l := range lines {
			if strings.Contains(l, oidB) {
				return notOurs
			}
		}
		return nil
	}
	for _, v2 := range []bool{false, true} {
		var stream []byte
		if v2 {
			stream = pkts("command=fetch", "DELIM", "want "+oidA, "want "+oidB, "done", "")
		} else {
			stream = pkts("want "+oidA+" side-band-64k", "want "+oidB, "", "done")
		}
		passed, before, client, err := gateRunChecked(t, v2, stream, nil, check)
		if !errors.Is(err, notOurs) || strings.Contains(passed, "want") || len(before) != 0 {
			t.Fatalf("v2=%v: err %v, admitted %d times, git got %q", v2, err, len(before), passed)
		}
		if !strings.Contains(client, "ERR upload-pack: not our ref "+oidB) {
			t.Fatalf("v2=%v: client got %q", v2, client)
		}
		// Allowed wants pass whole.
		stream = bytes.ReplaceAll(stream, []byte(oidB), []byte(oidA))
		if passed, _, _, err := gateRunChecked(t, v2, stream, nil, check); err != nil || passed != string(stream) {
			t.Fatalf("v2=%v: allowed request: err %v, git got %q", v2, err, passed)
		}
	}
}

// gateIntercept runs stream through a gate whose intercept answers every
// request it is given (answer: true) and records them; it returns what git
// got, the requests intercept saw and how many slots were taken.
func gateIntercept(t *testing.T, v2 bool, stream []byte, answer bool) (passed string, requests []string, admitted int) {
	t.Helper()
	var given bytes.Buffer
	g := newAdmissionGate(bytes.NewReader(stream), io.Discard, v2, func() error { admitted++; return nil }, nil, io.Discard, Pace{}, func(error) {})
	g.intercept = func(request []byte) (bool, error) {
		requests = append(requests, string(request))
		return answer, nil
	}
	buf := make([]byte, 5)
	for {
		n, err := g.Read(buf)
		given.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return given.String(), requests, admitted
}

// TestAdmissionGateIntercept: v2 fetch commands go to the fetch cache
// whole, one by one, and git never sees those it answers (it does see
// ls-refs and the session's end); v0 requests go whole from the first
// want to done, and git then gets an empty want list; a round (a flush
// among the haves) or shallow lines leave the request to git; what the
// cache does not answer reaches git whole, admitted.
func TestAdmissionGateIntercept(t *testing.T) {
	lsRefs := pkts("command=ls-refs", "DELIM", "peel", "")
	fetch1 := pkts("command=fetch", "DELIM", "want "+oidA, "done", "")
	fetch2 := pkts("command=fetch", "DELIM", "want "+oidA, "have "+oidA, "")
	stream := append(append(append(append([]byte{}, lsRefs...), fetch1...), fetch2...), "0000"...)
	passed, reqs, admitted := gateIntercept(t, true, stream, true)
	if passed != string(lsRefs)+"0000" || len(reqs) != 2 || reqs[0] != string(fetch1) || reqs[1] != string(fetch2) || admitted != 0 {
		t.Fatalf("v2 answered: git got %q, intercepted %q, %d slots", passed, reqs, admitted)
	}
	passed, reqs, admitted = gateIntercept(t, true, stream, false)
	if passed != string(stream) || len(reqs) != 2 || admitted != 2 {
		t.Fatalf("v2 not answered: git got %q, intercepted %d, %d slots", passed, len(reqs), admitted)
	}

	whole := pkts("want "+oidA+" side-band-64k", "", "have "+oidA, "done")
	passed, reqs, admitted = gateIntercept(t, false, whole, true)
	if passed != "0000" || len(reqs) != 1 || reqs[0] != string(whole) || admitted != 0 {
		t.Fatalf("v0 answered: git got %q, intercepted %q, %d slots", passed, reqs, admitted)
	}
	passed, reqs, admitted = gateIntercept(t, false, whole, false)
	if passed != string(whole) || len(reqs) != 1 || admitted != 1 {
		t.Fatalf("v0 not answered: git got %q, intercepted %d, %d slots", passed, len(reqs), admitted)
	}
	for name, stream := range map[string][]byte{
		"round":   pkts("want "+oidA+" side-band-64k", "", "have "+oidA, "", "have "+oidA, "done"),
		"shallow": pkts("want "+oidA+" side-band-64k", "deepen 1", "", "done"),
	} {
		passed, reqs, admitted = gateIntercept(t, false, stream, true)
		if passed != string(stream) || len(reqs) != 0 || admitted != 1 {
			t.Fatalf("v0 %s: git got %q, intercepted %q, %d slots", name, passed, reqs, admitted)
		}
	}
}
