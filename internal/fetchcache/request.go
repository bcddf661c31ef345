package fetchcache

import (
	"bytes"
	"errors"

	"packwire/internal/pktline"
)

// Reasons a request's response is not stored or replayed.
var (
	ErrNotFetch = errors.New("not a protocol v2 fetch command")
	// deepen-since and deepen-not cut history by commit dates and by ref
	// names that upload-pack resolves with git's own lookup rules; they are
	// rare in clone storms, and not worth a key that might miss an input.
	ErrDeepenBy = errors.New("the request uses deepen-since or deepen-not")
	// A request that is neither whole (v0: "done", v2: "done" or haves) nor
	// ends at a point where a stateless upload-pack gives the whole answer:
	// in v0 a flush among the haves is a negotiation round (a stateless
	// upload-pack answers it and exits; a session's client may wait for
	// it), as is v0's want section alone.
	ErrNotDone   = errors.New("the request does not end negotiation with done")
	ErrNoWants   = errors.New("the request wants nothing")
	ErrMalformed = errors.New("the request is not one well-formed fetch request")
)

// Request is a fetch request whose response may be stored and replayed.
type Request struct {
	// Key is the request as a key sees it: the client's packets in the
	// client's order, without its agent= capability. git's answer does not
	// depend on the agent (upload-pack only logs it; checked byte for byte
	// with git 2.39), so clients of different git versions that send the
	// same request share one entry. The order of the haves is kept: git's
	// answer depends on it (v0's ACK lines follow it, and even a v2 pack
	// after "done" differs byte for byte when two haves are swapped).
	Key []byte
	// Haves counts the have lines: an incremental fetch, whose response
	// the cache stores only on a second sighting (see Cache.SightingWindow).
	Haves int
	// Shallow is set for a v0 request with shallow or deepen lines: in a
	// git:// or SSH session the client waits after its wants for the
	// shallow list, so the request never arrives whole before an answer.
	Shallow bool
	// Round is set for a stateless v0 request that ends with the flush
	// after its haves (a negotiation round): a client that asked for
	// no-done (smart HTTP) gets its pack in the answer to such a round
	// once git says "ready", as a CI runner's fetch after a push does. In
	// a session a client may wait for a round's answer: never whole there.
	Round bool
}

// Check returns nil when body, the whole body of a stateless protocol v2
// request, is a fetch whose response may be stored and replayed (see
// Inspect).
func Check(body []byte) error {
	_, err := Inspect(body, true)
	return err
}

// Inspect tells whether body is a whole fetch request whose response may
// be stored and replayed, and returns its key form.
//
// v2 (a fetch command): one "command=fetch", capabilities, a delimiter,
// arguments with at least one want, no deepen-since/deepen-not, "done" or
// at least one have, a flush, and nothing after. A command with haves and
// no done is a negotiation round, and qualifies: when git finds the
// common commits in it, it says "ready" and sends the pack in the same
// answer (no done round follows), which is exactly a CI runner's fetch
// after a push. A round whose answer is acknowledgments only is as
// deterministic, and small.
//
// v0/v1 (what follows the advertisement): want lines (capabilities on the
// first), shallow/deepen/filter lines, a flush, have lines with no flush
// among them, and "done" or (Round) a flush after at least one have, and
// nothing after.
//
// Otherwise it returns one of the reasons above.
func Inspect(body []byte, v2 bool) (Request, error) {
	if v2 {
		return inspectV2(body)
	}
	return inspectV0(body)
}

// packet is one pkt-line of a request: n its length (0 flush, 1
// delimiter, 2 response end), raw its bytes, line its payload without the
// newline.
type packet struct {
	n         int
	raw, line []byte
}

// nextPacket splits the first packet off body.
func nextPacket(body []byte) (packet, []byte, error) {
	if len(body) < 4 {
		return packet{}, nil, ErrMalformed
	}
	n, err := pktline.ParseLength(body[:4])
	if err != nil || n == 3 || n > pktline.MaxLength || n > len(body) {
		return packet{}, nil, ErrMalformed
	}
	size := max(n, 4)
	p := packet{n: n, raw: body[:size]}
	if n > 4 {
		p.line = bytes.TrimSuffix(body[4:n], []byte("\n"))
	}
	return p, body[size:], nil
}

func inspectV2(body []byte) (Request, error) {
	cmd, err := InspectCommand(body)
	if err != nil {
		return Request{}, err
	}
	if cmd.Name != "fetch" {
		return Request{}, ErrNotFetch
	}
	wants, done := 0, false
	req := Request{Key: cmd.Key}
	for _, arg := range cmd.Args {
		word, _, _ := bytes.Cut(arg, []byte(" "))
		switch string(word) {
		case "want", "want-ref":
			wants++
		case "have":
			req.Haves++
		case "deepen-since", "deepen-not":
			return Request{}, ErrDeepenBy
		case "done":
			done = true
		}
	}
	switch {
	case wants == 0:
		return Request{}, ErrNoWants
	case !done && req.Haves == 0:
		return Request{}, ErrNotDone
	}
	return req, nil
}

func inspectV0(body []byte) (Request, error) {
	const (
		wantSection = iota
		haveSection
		ended
	)
	state := wantSection
	wants := 0
	req := Request{Key: make([]byte, 0, len(body))}
	for len(body) > 0 {
		if state == ended {
			return Request{}, ErrMalformed // bytes after done
		}
		p, rest, err := nextPacket(body)
		if err != nil {
			return Request{}, err
		}
		body = rest
		if p.n == 0 {
			if state == haveSection {
				if len(body) > 0 || req.Haves == 0 {
					return Request{}, ErrNotDone // rounds, or a round of nothing
				}
				req.Round = true // a stateless round, its answer whole
				state = ended
				req.Key = append(req.Key, p.raw...)
				continue
			}
			if wants == 0 {
				return Request{}, ErrNoWants // "0000": the client wants nothing
			}
			state = haveSection
			req.Key = append(req.Key, p.raw...)
			continue
		}
		if p.n < 4 {
			return Request{}, ErrMalformed // v0 has no delimiters
		}
		word, arg, _ := bytes.Cut(p.line, []byte(" "))
		raw := p.raw
		switch state {
		case wantSection:
			switch string(word) {
			case "want":
				if wants == 0 {
					if raw, err = withoutAgent(arg); err != nil {
						return Request{}, err
					}
				}
				wants++
			case "shallow", "deepen", "deepen-relative":
				req.Shallow = true
			case "deepen-since", "deepen-not":
				return Request{}, ErrDeepenBy
			case "filter":
			default:
				return Request{}, ErrMalformed
			}
		case haveSection:
			switch string(p.line) {
			case "done":
				state = ended
			default:
				if string(word) != "have" {
					return Request{}, ErrMalformed
				}
				req.Haves++
			}
		}
		req.Key = append(req.Key, raw...)
	}
	if state != ended {
		if wants == 0 {
			return Request{}, ErrNoWants
		}
		return Request{}, ErrNotDone
	}
	return req, nil
}

// withoutAgent re-frames the first want line ("want OID CAPS") without its
// agent= capability.
func withoutAgent(arg []byte) ([]byte, error) {
	fields := bytes.Fields(arg)
	kept := [][]byte{[]byte("want")}
	for _, f := range fields {
		if !bytes.HasPrefix(f, []byte("agent=")) {
			kept = append(kept, f)
		}
	}
	line := append(bytes.Join(kept, []byte(" ")), '\n')
	out, err := pktline.Append(nil, line)
	if err != nil {
		return nil, ErrMalformed
	}
	return out, nil
}
