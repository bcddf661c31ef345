package fetchcache

import (
	"bytes"
	"errors"

	"packwire/internal/pktline"
)

// Reasons a request's response is not stored or replayed.
var (
	ErrNotFetch = errors.New("not a protocol v2 fetch command")
	// A fetch with haves is an incremental fetch: its answer depends on
	// which of the client's objects the server has, and two clients rarely
	// send the same haves, so entries would be written to be read once.
	ErrHaves = errors.New("the request has have lines (incremental fetch)")
	// deepen-since and deepen-not cut history by commit dates and by ref
	// names that upload-pack resolves with git's own lookup rules; they are
	// rare in clone storms, and not worth a key that might miss an input.
	ErrDeepenBy = errors.New("the request uses deepen-since or deepen-not")
	// Without "done" this is a negotiation round: the client comes back
	// with another request, and the answer may be acknowledgments only.
	ErrNotDone   = errors.New("the request does not end negotiation with done")
	ErrNoWants   = errors.New("the request wants nothing")
	ErrMalformed = errors.New("the request is not one well-formed v2 command")
)

// Check returns nil when body, the whole body of a stateless protocol v2
// request, is a fetch whose response may be stored and replayed: one
// "command=fetch", capabilities, a delimiter, arguments with at least one
// want, no have, no deepen-since/deepen-not, "done", a flush, and nothing
// after. Otherwise it returns one of the reasons above.
func Check(body []byte) error {
	const (
		command = iota
		capabilities
		arguments
		ended
	)
	state := command
	wants, done := 0, false
	for len(body) > 0 {
		if state == ended {
			return ErrMalformed // a second command, or trailing bytes
		}
		if len(body) < 4 {
			return ErrMalformed
		}
		n, err := pktline.ParseLength(body[:4])
		if err != nil || n == 3 || n > pktline.MaxLength || n > len(body) {
			return ErrMalformed
		}
		switch {
		case n == 0: // flush: the end of the command
			if state == command {
				return ErrMalformed
			}
			state = ended
			body = body[4:]
			continue
		case n == 1: // delimiter: arguments follow
			if state != capabilities {
				return ErrMalformed
			}
			state = arguments
			body = body[4:]
			continue
		case n == 2: // response-end is for servers
			return ErrMalformed
		}
		line := bytes.TrimSuffix(body[4:n], []byte("\n"))
		body = body[n:]
		switch state {
		case command:
			if !bytes.Equal(line, []byte("command=fetch")) {
				if bytes.HasPrefix(line, []byte("command=")) {
					return ErrNotFetch
				}
				return ErrMalformed
			}
			state = capabilities
		case capabilities:
			if bytes.HasPrefix(line, []byte("command=")) {
				return ErrMalformed
			}
		case arguments:
			word, _, _ := bytes.Cut(line, []byte(" "))
			switch string(word) {
			case "want", "want-ref":
				wants++
			case "have":
				return ErrHaves
			case "deepen-since", "deepen-not":
				return ErrDeepenBy
			case "done":
				done = true
			}
		}
	}
	switch {
	case state != ended:
		return ErrMalformed
	case wants == 0:
		return ErrNoWants
	case !done:
		return ErrNotDone
	}
	return nil
}
