package push

import (
	"bytes"
	"io"
	"strings"
	"time"

	"packwire/internal/pktline"
)

// Rewrite says how to change receive-pack's report for the client.
type Rewrite struct {
	// Refs is every ref of the client's request in its order: the report
	// lists them in that order.
	Refs []string
	// Refused are refs receive-pack never saw, with the reason to report.
	Refused map[string]string
	// Reason, if set, may replace the reason of a ref receive-pack refused
	// ("non-fast-forward" -> "protected: force-push denied"). It returns
	// the reason unchanged when it does not own it.
	Reason func(ref, reason string) string
	// Final is the report as Apply last rewrote it: what the client got.
	Final []string
}

// group is one ref's lines in a report: "ok REF" or "ng REF REASON", then
// report-status-v2 "option ..." lines.
type group struct {
	ref   string
	lines []string
}

// Apply rewrites a report (its pkt-line payloads, without the final
// flush) and returns the new payloads.
func (rw *Rewrite) Apply(lines []string) []string {
	var out []string
	var groups []*group
	byRef := map[string][]*group{}
	for _, l := range lines {
		trimmed := strings.TrimSuffix(l, "\n")
		switch {
		case strings.HasPrefix(trimmed, "unpack "):
			out = append(out, l)
		case strings.HasPrefix(trimmed, "ok ") || strings.HasPrefix(trimmed, "ng "):
			ref, reason, _ := strings.Cut(trimmed[3:], " ")
			if trimmed[:2] == "ng" && rw.Reason != nil {
				if nr := rw.Reason(ref, reason); nr != reason {
					l = "ng " + ref + " " + nr + "\n"
				}
			}
			g := &group{ref: ref, lines: []string{l}}
			groups = append(groups, g)
			byRef[ref] = append(byRef[ref], g)
		default: // "option ..." lines belong to the preceding ok/ng
			if len(groups) > 0 {
				g := groups[len(groups)-1]
				g.lines = append(g.lines, l)
			} else {
				out = append(out, l)
			}
		}
	}
	if len(out) == 0 {
		out = append(out, "unpack ok\n")
	}
	emitted := map[*group]bool{}
	seen := map[string]bool{}
	for _, ref := range rw.Refs {
		if seen[ref] {
			continue
		}
		seen[ref] = true
		if reason, ok := rw.Refused[ref]; ok {
			out = append(out, "ng "+ref+" "+oneLine(reason)+"\n")
			continue
		}
		for _, g := range byRef[ref] {
			out = append(out, g.lines...)
			emitted[g] = true
		}
	}
	for _, g := range groups {
		if !emitted[g] {
			out = append(out, g.lines...)
		}
	}
	rw.Final = out
	return out
}

func oneLine(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > 1000 {
		s = s[:1000]
	}
	return s
}

// Encode frames report payloads as receive-pack does: pkt-lines and a
// flush, inside band 1 packets of at most sideband bytes when sideband > 0,
// followed by the top-level flush receive-pack ends with.
func Encode(lines []string, sideband int) []byte {
	var inner []byte
	for _, l := range lines {
		inner, _ = pktline.Append(inner, []byte(l))
	}
	inner = append(inner, "0000"...)
	if sideband <= 0 {
		return inner
	}
	var out []byte
	for len(inner) > 0 {
		n := min(len(inner), sideband)
		out, _ = pktline.Append(out, append([]byte{1}, inner[:n]...))
		inner = inner[n:]
	}
	return append(out, "0000"...)
}

// ReportWriter sits between receive-pack's stdout and the client. It
// passes everything through as it arrives except the report, which it
// holds until complete, rewrites and sends: with a side-band, band 2 and 3
// (progress, errors) and empty band 1 packets (keepalives) go straight
// through, band 1 data is the report; without, receive-pack's stateless
// output is the report alone.
type ReportWriter struct {
	w        io.Writer
	sideband int
	rw       *Rewrite

	pending []byte // bytes of an incomplete top-level packet
	report  []byte // the report's pkt-line stream (band 1 data, or the plain lines)
	done    bool   // the report was sent
	raw     bool   // unparseable output: pass through untouched from here
}

// NewReportWriter returns a writer that rewrites the report on its way to w.
func NewReportWriter(w io.Writer, sideband int, rw *Rewrite) *ReportWriter {
	return &ReportWriter{w: w, sideband: sideband, rw: rw}
}

// Reported tells whether receive-pack wrote any of its report (or output
// that was passed on untouched).
func (r *ReportWriter) Reported() bool {
	return r.done || r.raw || len(r.report) > 0 || len(r.pending) > 0
}

// SetWriteDeadline forwards to the client stream (see gitexec.WriteDeadliner).
func (r *ReportWriter) SetWriteDeadline(t time.Time) error {
	if d, ok := r.w.(interface{ SetWriteDeadline(time.Time) error }); ok {
		return d.SetWriteDeadline(t)
	}
	return nil
}

// Write parses p, passing through what is not the report.
func (r *ReportWriter) Write(p []byte) (int, error) {
	if r.raw || r.done {
		return len(p), r.write(p)
	}
	r.pending = append(r.pending, p...)
	var pass []byte
	for {
		if len(r.pending) < 4 {
			break
		}
		n, err := pktline.ParseLength(r.pending[:4])
		if err != nil || n == 3 || n > pktline.MaxLength {
			return len(p), r.goRaw(pass)
		}
		if n == 1 || n == 2 {
			return len(p), r.goRaw(pass)
		}
		if n == 0 { // the top-level flush: the report is complete
			r.pending = r.pending[4:]
			if r.sideband <= 0 {
				r.report = append(r.report, "0000"...)
			}
			if err := r.write(pass); err != nil {
				return len(p), err
			}
			pass = nil
			if err := r.sendReport(); err != nil {
				return len(p), err
			}
			rest := r.pending
			r.pending = nil
			return len(p), r.write(rest)
		}
		if len(r.pending) < n {
			break
		}
		pkt := r.pending[:n]
		if r.sideband > 0 {
			switch {
			case n > 4 && pkt[4] == 1 && n > 5:
				r.report = append(r.report, pkt[5:]...)
			case n > 4 && (pkt[4] == 1 || pkt[4] == 2 || pkt[4] == 3):
				pass = append(pass, pkt...)
			default:
				return len(p), r.goRaw(pass)
			}
		} else {
			r.report = append(r.report, pkt...)
		}
		r.pending = r.pending[n:]
	}
	return len(p), r.write(pass)
}

// goRaw gives up parsing: what was held is sent as it came.
func (r *ReportWriter) goRaw(pass []byte) error {
	r.raw = true
	if err := r.write(pass); err != nil {
		return err
	}
	held := r.frameReport(r.report)
	held = append(held, r.pending...)
	r.report, r.pending = nil, nil
	return r.write(held)
}

// frameReport puts held report bytes back in their original framing.
func (r *ReportWriter) frameReport(b []byte) []byte {
	if r.sideband <= 0 || len(b) == 0 {
		return b
	}
	var out []byte
	for len(b) > 0 {
		n := min(len(b), r.sideband)
		out, _ = pktline.Append(out, append([]byte{1}, b[:n]...))
		b = b[n:]
	}
	return out
}

func (r *ReportWriter) write(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	_, err := r.w.Write(b)
	return err
}

// sendReport parses the held report, rewrites it and sends it with the
// closing flush.
func (r *ReportWriter) sendReport() error {
	r.done = true
	lines, ok := parseLines(r.report)
	if !ok {
		// Not a report we understand: send it as it came, with the flush.
		out := r.frameReport(r.report)
		r.report = nil
		if r.sideband > 0 {
			out = append(out, "0000"...)
		}
		return r.write(out)
	}
	r.report = nil
	return r.write(Encode(r.rw.Apply(lines), r.sideband))
}

// Finish sends what is still held when receive-pack exited without
// finishing its report (it died): as it came, nothing invented.
func (r *ReportWriter) Finish() error {
	if r.done || r.raw {
		return nil
	}
	r.raw = true
	out := r.frameReport(r.report)
	out = append(out, r.pending...)
	r.report, r.pending = nil, nil
	return r.write(out)
}

// Sent reports whether the rewritten report reached the client.
func (r *ReportWriter) Sent() bool { return r.done }

// parseLines splits a report's pkt-line stream into payloads; the stream
// must end with exactly one flush.
func parseLines(b []byte) ([]string, bool) {
	var lines []string
	for len(b) > 0 {
		if len(b) < 4 {
			return nil, false
		}
		n, err := pktline.ParseLength(b[:4])
		if err != nil || n == 1 || n == 2 || n == 3 || n > len(b) {
			return nil, false
		}
		if n == 0 {
			return lines, len(bytes.TrimSpace(b[4:])) == 0
		}
		lines = append(lines, string(b[4:n]))
		b = b[n:]
	}
	return nil, false
}
