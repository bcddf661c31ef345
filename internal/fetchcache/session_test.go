package fetchcache

import (
	"bytes"
	"context"
	"io"
	"os"
	"slices"
	"testing"
	"time"
)

// recordSession records a conversation: the leader's client sends "a",
// git answers "A" (written with all of "a" given), then "bb" and "BB".
func recordSession(t *testing.T, c *Cache, key string) *SessionRecorder {
	t.Helper()
	_, rec, err := c.JoinSession(key)
	if err != nil || rec == nil {
		t.Fatalf("join %s: leader %v, %v", key, rec != nil, err)
	}
	rec.Output([]byte("ADV0000")) // before any input
	rec.Input([]byte("a"))
	rec.Output([]byte("A"))
	rec.Input([]byte("bb"))
	rec.Output([]byte("BB"))
	return rec
}

// TestSessionStep: a follower is sent each piece of the output once its
// input matches the recording up to where git wrote it; it diverges on a
// different byte; it is done once it has everything and git would have
// ended; a stored recording replays the same, and a second sighting
// stores it while a first does not.
func TestSessionStep(t *testing.T) {
	c := newCache(t, 1<<20)
	rec := recordSession(t, c, "k")
	replay, leader, err := c.JoinSession("k")
	if err != nil || leader != nil {
		t.Fatalf("a second session of a running recording: leader %v, %v", leader != nil, err)
	}
	for _, tc := range []struct {
		input string
		sent  int64
		want  SessionStep
	}{
		{"", 0, SessionStep{SendTo: 7, NeedInput: true}},
		{"a", 7, SessionStep{SendTo: 8, NeedInput: true}},
		{"ab", 8, SessionStep{SendTo: 8, NeedInput: true}},
		{"abb", 8, SessionStep{SendTo: 10}},
		{"abbX", 10, SessionStep{SendTo: 10}}, // ahead of the leader: wait for it
		{"x", 7, SessionStep{SendTo: 7, Diverged: true}},
		{"abX", 8, SessionStep{SendTo: 8, Diverged: true}},
	} {
		got := replay.Step([]byte(tc.input), tc.sent)
		got.Changed = nil
		if got != tc.want {
			t.Errorf("live, input %q sent %d: %+v, want %+v", tc.input, tc.sent, got, tc.want)
		}
	}
	rec.Finish(true)
	if st := replay.Step([]byte("abb"), 10); !st.Done || st.Changed != nil {
		t.Fatalf("after the leader finished: %+v", st)
	}
	if st := replay.Step([]byte("ab"), 8); st.Done || !st.NeedInput {
		t.Fatalf("a follower short of the input git ended after: %+v", st)
	}
	var out bytes.Buffer
	if n, err := replay.Send(context.Background(), &out, 7, 10, time.Second); n != 3 || err != nil || out.String() != "ABB" {
		t.Fatalf("send [7,10): %d %v %q", n, err, out.String())
	}
	replay.Close()

	stored, leader, err := c.JoinSession("k")
	if err != nil || leader != nil {
		t.Fatalf("a followed recording was not stored: leader %v, %v", leader != nil, err)
	}
	if st := stored.Step([]byte("abb"), 7); st.SendTo != 10 || st.Done {
		t.Fatalf("stored: %+v", st)
	}
	if st := stored.Step([]byte("abb"), 10); !st.Done {
		t.Fatalf("stored, all sent: %+v", st)
	}
	stored.Close()

	// A recording nobody followed is not kept at its first sighting.
	recordSession(t, c, "once").Finish(true)
	if _, leader, _ := c.JoinSession("once"); leader == nil {
		t.Fatal("a one-off recording was stored")
	} else {
		leader.Finish(false)
	}

	// A failed recording makes its followers diverge.
	rec = recordSession(t, c, "failed")
	replay, _, _ = c.JoinSession("failed")
	rec.Finish(false)
	if st := replay.Step([]byte("abb"), 10); !st.Diverged {
		t.Fatalf("follower of a failed recording: %+v", st)
	}
	replay.Close()
}

// TestSessionPublish: a recording started before its key is known is
// followable once published, and not published twice.
func TestSessionPublish(t *testing.T) {
	c := newCache(t, 1<<20)
	rec, err := c.NewSessionRecording()
	if err != nil {
		t.Fatal(err)
	}
	rec.Output([]byte("ADV0000"))
	if !rec.Publish("k") {
		t.Fatal("not published")
	}
	if rec.Publish("k2") {
		t.Fatal("published twice")
	}
	replay, leader, err := c.JoinSession("k")
	if err != nil || leader != nil {
		t.Fatalf("join a published recording: leader %v, %v", leader != nil, err)
	}
	if st := replay.Step(nil, 0); st.SendTo != 7 {
		t.Fatalf("published recording: %+v", st)
	}
	replay.Close()
	rec.Finish(true)
}

// TestSessionBreakStopsWriting: a recording nobody can follow, broken,
// writes none of what git sends after (the leader's pipeline breaks an
// unpublished one: a clone's pack would go to disk for nothing), and is
// not stored.
func TestSessionBreakStopsWriting(t *testing.T) {
	c := newCache(t, 1<<20)
	rec, err := c.NewSessionRecording()
	if err != nil {
		t.Fatal(err)
	}
	rec.Output([]byte("ADV0000"))
	before := rec.w.out.N()
	if before == 0 {
		t.Fatal("a recording wrote nothing")
	}
	rec.Break()
	rec.Input([]byte("want"))
	rec.Output(bytes.Repeat([]byte("pack"), 1<<16))
	if after := rec.w.out.N(); after != before {
		t.Fatalf("a broken recording went on writing: %d -> %d bytes", before, after)
	}
	rec.Finish(true)
	if st := c.Stats(); st.Entries != 0 || st.Runs != 0 {
		t.Fatalf("a broken recording was kept: %+v", st)
	}
}

// TestSessionTrailerRoundTrip: a log survives its trailer.
func TestSessionTrailerRoundTrip(t *testing.T) {
	l := newSessionLog()
	l.input = []byte("want x\n0000")
	l.out = 30
	l.pieces = []sessionPiece{{end: 10, in: 0}, {end: 25, in: 4}, {end: 30, in: 11}}
	b := encodeSessionTrailer(l)
	got, err := readSessionTrailer(bytes.NewReader(append(make([]byte, 30), b...)), int64(30+len(b)))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.input, l.input) || got.out != l.out || len(got.pieces) != 3 || got.pieces[1] != l.pieces[1] || !got.ok {
		t.Fatalf("round trip: %+v", got)
	}
}

// FuzzParseSessionTrailer: any bytes give an error or a log whose pieces
// stay within its input and output, in order.
func FuzzParseSessionTrailer(f *testing.F) {
	l := newSessionLog()
	l.input, l.out = []byte("abc"), 9
	l.pieces = []sessionPiece{{end: 4, in: 0}, {end: 9, in: 3}}
	b := encodeSessionTrailer(l)
	f.Add(b[:len(b)-16])
	f.Add([]byte{0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		log, err := ParseSessionTrailer(b)
		if err != nil {
			return
		}
		var end, in int64
		for _, p := range log.pieces {
			if p.end <= end || p.in < in || p.end > log.out || p.in > int64(len(log.input)) {
				t.Fatalf("bad piece %+v after %d/%d in %+v", p, end, in, log)
			}
			end, in = p.end, p.in
		}
		if end != log.out {
			t.Fatalf("pieces end at %d, output %d", end, log.out)
		}
		log.step(log.input, 0)
	})
}

// TestSessionInputPastTheBound: once the leader's input outgrows
// MaxSessionInput the recording ends failed at once; output git writes
// afterwards (answering input that was not recorded) is never offered to
// a follower whose input matches the shorter recorded prefix.
func TestSessionInputPastTheBound(t *testing.T) {
	c := newCache(t, 1<<20)
	rec := recordSession(t, c, "k")
	replay, _, err := c.JoinSession("k")
	if err != nil {
		t.Fatal(err)
	}
	rec.Input(make([]byte, MaxSessionInput)) // past the bound with what came before
	rec.Output([]byte("ACKS-FOR-UNRECORDED-HAVES"))
	st := replay.Step([]byte("abbY"), 10)
	if st.SendTo > 10 || !st.Diverged {
		t.Fatalf("a follower past the recorded input: %+v, want diverged with nothing more to send", st)
	}
}

// streamRecorder is a transport's writer that sends files itself and
// tells whole stretches apart (DoneStreamer).
type streamRecorder struct {
	bytes.Buffer
	calls []string
}

func (w *streamRecorder) StreamFile(f *os.File, n int64) (int64, error) {
	w.calls = append(w.calls, "StreamFile")
	return io.CopyN(&w.Buffer, f, n)
}

func (w *streamRecorder) StreamDone(f *os.File, n int64) (int64, error) {
	w.calls = append(w.calls, "StreamDone")
	return io.CopyN(&w.Buffer, f, n)
}

// TestSessionSendDoneStretches: output of a recording still running goes
// out through StreamFile (more may follow: the SSH transport paces it);
// once the recording ended whole, through StreamDone.
func TestSessionSendDoneStretches(t *testing.T) {
	c := newCache(t, 1<<20)
	rec := recordSession(t, c, "k")
	replay, leader, err := c.JoinSession("k")
	if err != nil || leader != nil {
		t.Fatalf("join: leader %v, %v", leader != nil, err)
	}
	defer replay.Close()
	w := &streamRecorder{}
	if _, err := replay.Send(context.Background(), w, 0, 8, 0); err != nil {
		t.Fatal(err)
	}
	rec.Finish(true)
	if _, err := replay.Send(context.Background(), w, 8, 10, 0); err != nil {
		t.Fatal(err)
	}
	if got := w.String(); got != "ADV0000ABB" {
		t.Fatalf("sent %q", got)
	}
	if want := []string{"StreamFile", "StreamDone"}; !slices.Equal(w.calls, want) {
		t.Fatalf("calls %v, want %v", w.calls, want)
	}
}
