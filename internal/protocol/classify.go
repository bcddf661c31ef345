// Package protocol classifies a git request from what the client sends:
// wants, haves, depth, filter, pushed refs, and from those the kind of
// operation (full clone, shallow fetch, ...). It reads a copy of the
// client's stream as it passes, stops parsing once it knows enough (before
// a push's pack), and never holds the relay up.
package protocol

import (
	"io"
	"slices"
	"strconv"
	"strings"

	"packwire/internal/gitexec"
	"packwire/internal/pktline"
)

// Kind is what a request did, in the terms of the clone/fetch study.
type Kind string

const (
	FullClone        Kind = "full-clone"
	ShallowClone     Kind = "shallow-clone"
	PartialClone     Kind = "partial-clone"
	IncrementalFetch Kind = "incremental-fetch"
	ShallowFetch     Kind = "shallow-fetch"
	NoOp             Kind = "no-op"       // a fetch that wanted nothing (ls-remote, up to date)
	Refs             Kind = "refs"        // an HTTP advertisement or a v2 ls-refs request
	Negotiation      Kind = "negotiation" // a stateless HTTP round without "done"
	Push             Kind = "push"
	Archive          Kind = "archive"
	Unknown          Kind = "unknown" // the client left before saying what it wanted
)

// Summary is what a Classifier learnt about one request.
type Summary struct {
	Kind       Kind
	Wants      int
	Haves      int
	Depth      int    // deepen N; 0 if none
	Deepen     string // deepen-since / deepen-not / deepen-relative, if used
	Filter     string // partial clone filter spec
	Shallows   int    // "shallow" lines: the client's own shallow boundary
	Done       bool   // the client ended negotiation
	PushedRefs int
	Commands   []string // v2 commands seen (ls-refs, fetch)
}

// Classifier is an io.Writer fed with a copy of the client's stream.
type Classifier struct {
	service gitexec.Service
	v2      bool
	buf     []byte
	stopped bool
	inFetch bool // v2: inside a fetch command's arguments
	sawAny  bool // any packet at all: a client that sent nothing is Unknown
	s       Summary
	out     responseWatcher
}

// responseWatcher reads the start of git's response for a v2 fetch: the
// server sends the pack without waiting for "done" once it is "ready", so
// only the response tells a finished fetch from a negotiation round.
type responseWatcher struct {
	buf     []byte
	stopped bool
	pack    bool
}

func (w *responseWatcher) Write(p []byte) (int, error) {
	if w.stopped {
		return len(p), nil
	}
	w.buf = append(w.buf, p...)
	for len(w.buf) >= 4 && !w.stopped {
		n, err := pktline.ParseLength(w.buf[:4])
		switch {
		case err != nil || n == 3 || n > pktline.MaxLength:
			w.stopped = true
		case n == 0: // end of a response without a pack
			w.stopped = true
		case n < 4:
			w.buf = w.buf[4:]
		case len(w.buf) < n:
			return len(p), nil
		default:
			if strings.TrimSuffix(string(w.buf[4:n]), "\n") == "packfile" {
				w.pack, w.stopped = true, true
			}
			w.buf = w.buf[n:]
		}
	}
	if w.stopped || len(w.buf) > maxBuffered {
		w.buf, w.stopped = nil, true
	}
	return len(p), nil
}

// Response returns a writer to be fed a copy of git's output; it stops
// looking after the first section, long before the pack data.
func (c *Classifier) Response() io.Writer { return &c.out }

// maxBuffered bounds what the classifier holds while waiting for the rest
// of a pkt-line; a real pkt-line is at most 65520 bytes.
const maxBuffered = pktline.MaxLength

// NewClassifier returns a classifier for service ("git-upload-pack", ...)
// spoken in protocol v2 or not.
func NewClassifier(service gitexec.Service, v2 bool) *Classifier {
	return &Classifier{service: service, v2: v2}
}

// Write parses complete pkt-lines; it never fails, so a tee through it can
// not break the relay.
func (c *Classifier) Write(p []byte) (int, error) {
	if c.stopped {
		return len(p), nil
	}
	c.buf = append(c.buf, p...)
	for !c.stopped {
		if len(c.buf) < 4 {
			break
		}
		n, err := pktline.ParseLength(c.buf[:4])
		if err != nil || n == 3 || n > pktline.MaxLength {
			c.stopped = true // not pkt-lines (or a pack): nothing more to learn
			break
		}
		c.sawAny = true
		if n < 4 {
			c.special(n)
			c.buf = c.buf[4:]
			continue
		}
		if len(c.buf) < n {
			break
		}
		c.line(strings.TrimSuffix(string(c.buf[4:n]), "\n"))
		c.buf = c.buf[n:]
	}
	if len(c.buf) > maxBuffered || c.stopped {
		c.buf = nil
	}
	// Keep the buffer from growing by re-slicing forever.
	if len(c.buf) == 0 {
		c.buf = c.buf[:0:0]
	}
	return len(p), nil
}

func (c *Classifier) special(n int) {
	switch {
	case c.service == gitexec.ReceivePack && n == 0:
		// The command list ends at the first flush; the pack follows.
		c.stopped = true
	case c.v2 && n == 0:
		c.inFetch = false
	}
}

func (c *Classifier) line(l string) {
	switch c.service {
	case gitexec.ReceivePack:
		// "old new ref\0capabilities" or "push-cert\0..." lines.
		if f := strings.Fields(strings.SplitN(l, "\x00", 2)[0]); len(f) == 3 && len(f[0]) >= 40 {
			c.s.PushedRefs++
		}
		return
	case gitexec.UploadArchive:
		return
	}
	if c.v2 {
		if cmd, ok := strings.CutPrefix(l, "command="); ok {
			c.s.Commands = append(c.s.Commands, cmd)
			c.inFetch = cmd == "fetch"
			return
		}
		if !c.inFetch {
			return
		}
	}
	word, arg, _ := strings.Cut(l, " ")
	switch word {
	case "want", "want-ref":
		c.s.Wants++
	case "have":
		c.s.Haves++
	case "shallow":
		c.s.Shallows++
	case "deepen":
		if d, err := strconv.Atoi(strings.TrimSpace(arg)); err == nil {
			c.s.Depth = d
		}
	case "deepen-since", "deepen-not":
		c.s.Deepen = word
	case "deepen-relative":
		c.s.Deepen = word
	case "filter":
		c.s.Filter = strings.TrimSpace(arg)
	case "done":
		c.s.Done = true
	}
}

// PackRequested reports whether the client has asked for a pack so far: a
// want line, or a v2 command=fetch. A stream that is not pkt-lines counts
// as asking (git will refuse it; whoever admits work treats it as work).
// Call it from the goroutine that writes to the classifier.
func (c *Classifier) PackRequested() bool {
	return c.stopped || c.s.Wants > 0 || slices.Contains(c.s.Commands, "fetch")
}

// Summary returns what was learnt and the kind it adds up to. advertise is
// true for an HTTP info/refs request, which carries no client data.
func (c *Classifier) Summary(advertise, stateless bool) Summary {
	s := c.s
	switch {
	case c.service == gitexec.ReceivePack:
		s.Kind = Push
		if advertise {
			s.Kind = Refs
		}
	case c.service == gitexec.UploadArchive:
		s.Kind = Archive
	case advertise:
		s.Kind = Refs
	case !c.sawAny:
		s.Kind = Unknown
	case c.v2 && s.Wants == 0 && containsOnly(s.Commands, "ls-refs"):
		s.Kind = Refs
		if !stateless {
			s.Kind = NoOp
		}
	case s.Wants == 0:
		s.Kind = NoOp
	case stateless && !s.Done && !(c.v2 && c.out.pack):
		s.Kind = Negotiation
	case s.Haves == 0 && s.Shallows == 0:
		switch {
		case s.Depth > 0 || s.Deepen != "":
			s.Kind = ShallowClone
		case s.Filter != "":
			s.Kind = PartialClone
		default:
			s.Kind = FullClone
		}
	case s.Depth > 0 || s.Deepen != "":
		s.Kind = ShallowFetch
	default:
		s.Kind = IncrementalFetch
	}
	return s
}

// Settled returns the kind as soon as what the client sent fixes it: at
// once for a push or an archive, once a fetch said "done". Before that ok
// is false (a fetch may still turn out a negotiation round or a no-op).
// Call it from the goroutine that writes to the classifier.
func (c *Classifier) Settled(stateless bool) (kind Kind, ok bool) {
	switch {
	case c.service == gitexec.ReceivePack:
		return Push, true
	case c.service == gitexec.UploadArchive:
		return Archive, true
	case !c.s.Done:
		return "", false
	}
	// With Done set, Summary never reads the response watcher, which
	// another goroutine writes.
	return c.Summary(false, stateless).Kind, true
}

func containsOnly(list []string, what string) bool {
	for _, v := range list {
		if v != what {
			return false
		}
	}
	return true
}

// Version is the protocol version a GIT_PROTOCOL value asks for ("version=2",
// possibly among other colon-separated keys); 0 when it names none.
func Version(gitProtocol string) int {
	for _, kv := range strings.Split(gitProtocol, ":") {
		switch kv {
		case "version=2":
			return 2
		case "version=1":
			return 1
		}
	}
	return 0
}
