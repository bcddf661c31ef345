package accept

import (
	"log/slog"
	"sort"
	"sync"
	"time"
)

// SummaryEvery is how often a RefusalLog writes a line per reason at most.
var SummaryEvery = 10 * time.Second

// RefusalLog logs refused connections without a line apiece: the first
// refusal for a reason is logged at once, the ones for that reason after
// it are counted and logged every SummaryEvery as one line with their
// number and the last address. A flood of refusals then costs the log a line per
// reason every few seconds, not one per connection.
type RefusalLog struct {
	Log *slog.Logger // nil: slog.Default

	mu      sync.Mutex
	pending map[string]*tally
	timer   *time.Timer
}

type tally struct {
	n       int
	last    string
	lastErr string
}

// Note records that a connection from remote was refused for reason.
func (r *RefusalLog) Note(reason, remote string) { r.NoteError(reason, remote, nil) }

// NoteError is Note with the error behind the refusal (nil: none), logged
// with the first refusal and the last one of a summary.
func (r *RefusalLog) NoteError(reason, remote string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pending == nil {
		r.pending = make(map[string]*tally)
	}
	if t := r.pending[reason]; t != nil {
		t.n++
		t.last = remote
		if err != nil {
			t.lastErr = err.Error()
		}
		return
	}
	r.pending[reason] = &tally{}
	if r.timer == nil {
		r.timer = time.AfterFunc(SummaryEvery, r.flush)
	}
	if err != nil {
		r.logger().Warn("connection refused", "reason", reason, "remote", remote, "error", err.Error())
		return
	}
	r.logger().Warn("connection refused", "reason", reason, "remote", remote)
}

// flush logs, per reason, what was counted since its last line; a reason
// with nothing counted is logged at once again on its next refusal.
func (r *RefusalLog) flush() {
	r.mu.Lock()
	defer r.mu.Unlock()
	reasons := make([]string, 0, len(r.pending))
	for reason, t := range r.pending {
		if t.n == 0 {
			delete(r.pending, reason)
			continue
		}
		reasons = append(reasons, reason)
	}
	sort.Strings(reasons)
	for _, reason := range reasons {
		t := r.pending[reason]
		attrs := []any{"reason", reason, "count", t.n, "within", SummaryEvery.String(), "last_remote", t.last}
		if t.lastErr != "" {
			attrs = append(attrs, "last_error", t.lastErr)
		}
		r.logger().Warn("connections refused", attrs...)
		t.n, t.lastErr = 0, ""
	}
	r.timer = nil
	if len(r.pending) > 0 {
		r.timer = time.AfterFunc(SummaryEvery, r.flush)
	}
}

// Stop drops a pending summary line (the listener is gone).
func (r *RefusalLog) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
}

func (r *RefusalLog) logger() *slog.Logger {
	if r.Log == nil {
		return slog.Default()
	}
	return r.Log
}
