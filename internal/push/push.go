// Package push reads and rewrites the receive-pack side of git's push
// protocol (gitprotocol-pack): the client's command list with its
// capabilities and push options, and receive-pack's report-status (v1 and
// v2, plain or inside side-band-64k). The pipeline uses it to decide each
// ref command before receive-pack sees it and to report refusals in git's
// own words; it holds no policy.
package push

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"

	"packwire/internal/oid"
	"packwire/internal/pktline"
)

// Command is one ref update the client asks for.
type Command struct {
	Old, New, Ref string
}

// IsCreate reports whether the command creates the ref (old is the zero id).
func (c Command) IsCreate() bool { return isZero(c.Old) }

// IsDelete reports whether the command deletes the ref (new is the zero id).
func (c Command) IsDelete() bool { return isZero(c.New) }

func isZero(id string) bool { return strings.Trim(id, "0") == "" }

// Request is the part of a push request before the pack.
type Request struct {
	Shallow  []string  // "shallow <oid>" lines sent before the commands
	Commands []Command // in the client's order
	Caps     string    // capabilities of the first command line, as sent
	Options  []string  // push options (only with the push-options capability)
}

// HasCap reports whether the client asked for capability name.
func (r *Request) HasCap(name string) bool {
	for _, c := range strings.Fields(r.Caps) {
		if c == name || strings.HasPrefix(c, name+"=") {
			return true
		}
	}
	return false
}

// Sideband returns the maximum band payload if the client asked for a
// side-band (65519 for side-band-64k, 999 for side-band), else 0.
func (r *Request) Sideband() int {
	switch {
	case r.HasCap("side-band-64k"):
		return pktline.MaxPayload - 1
	case r.HasCap("side-band"):
		return 999
	}
	return 0
}

// Reports tells whether the client asked for a report (report-status or
// report-status-v2).
func (r *Request) Reports() bool { return r.HasCap("report-status") || r.HasCap("report-status-v2") }

// NeedsPack reports whether a pack follows the request: every command but
// a delete sends objects (possibly an empty pack).
func (r *Request) NeedsPack() bool {
	for _, c := range r.Commands {
		if !c.IsDelete() {
			return true
		}
	}
	return false
}

// ErrNoCommands is returned when the client ended the request (EOF or a
// flush) without commands: nothing to do, nothing to answer.
var ErrNoCommands = errors.New("push: no commands")

// ErrMalformed is wrapped by every protocol error.
var ErrMalformed = errors.New("malformed push request")

// ErrTooManyCommands is returned for a push with more ref updates than the
// reader was told to take.
var ErrTooManyCommands = errors.New("too many ref updates in one push")

// ReadRequest reads the command list, and the push options when the
// capability was asked for, leaving r at the first byte of the pack. A
// request with more than maxCommands commands is refused as it is read,
// so that its size costs no memory (0: no bound).
func ReadRequest(r io.Reader, maxCommands int) (*Request, error) {
	pr := pktline.NewReader(r)
	req := &Request{}
	for {
		kind, payload, err := pr.Read()
		if err == io.EOF && len(req.Commands) == 0 && len(req.Shallow) == 0 {
			return nil, ErrNoCommands
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
		}
		if kind == pktline.Flush {
			break
		}
		if kind != pktline.Data {
			return nil, fmt.Errorf("%w: unexpected special packet", ErrMalformed)
		}
		line := strings.TrimSuffix(string(payload), "\n")
		if rest, ok := strings.CutPrefix(line, "shallow "); ok && len(req.Commands) == 0 {
			if !oid.Valid(rest) {
				return nil, fmt.Errorf("%w: bad shallow line", ErrMalformed)
			}
			req.Shallow = append(req.Shallow, rest)
			continue
		}
		if strings.HasPrefix(line, "push-cert") {
			return nil, fmt.Errorf("%w: signed pushes are not supported", ErrMalformed)
		}
		if len(req.Commands) == 0 {
			cmdPart, caps, _ := strings.Cut(line, "\x00")
			// Capabilities are space-separated words on one line.
			if strings.ContainsAny(caps, "\x00\n\r") {
				return nil, fmt.Errorf("%w: control characters in capabilities", ErrMalformed)
			}
			line, req.Caps = cmdPart, caps
		} else if strings.IndexByte(line, 0) >= 0 {
			return nil, fmt.Errorf("%w: NUL in a command", ErrMalformed)
		}
		c, err := parseCommand(line)
		if err != nil {
			return nil, err
		}
		if maxCommands > 0 && len(req.Commands) >= maxCommands {
			return nil, fmt.Errorf("%w (max %d): push them in several parts", ErrTooManyCommands, maxCommands)
		}
		req.Commands = append(req.Commands, c)
	}
	if len(req.Commands) == 0 {
		if len(req.Shallow) > 0 {
			return nil, fmt.Errorf("%w: shallow lines without commands", ErrMalformed)
		}
		return nil, ErrNoCommands
	}
	if req.HasCap("push-options") {
		for {
			kind, payload, err := pr.Read()
			if err != nil {
				return nil, fmt.Errorf("%w: push options: %v", ErrMalformed, err)
			}
			if kind == pktline.Flush {
				break
			}
			if kind != pktline.Data {
				return nil, fmt.Errorf("%w: unexpected special packet in push options", ErrMalformed)
			}
			req.Options = append(req.Options, strings.TrimSuffix(string(payload), "\n"))
		}
	}
	return req, nil
}

func parseCommand(line string) (Command, error) {
	f := strings.SplitN(line, " ", 3)
	if len(f) != 3 || !oid.Valid(f[0]) || !oid.Valid(f[1]) || len(f[0]) != len(f[1]) || f[2] == "" {
		return Command{}, fmt.Errorf("%w: bad command %q", ErrMalformed, truncate(line, 100))
	}
	for _, c := range f[2] {
		if c < 0x20 || c == 0x7f || c == ' ' {
			return Command{}, fmt.Errorf("%w: bad ref name %q", ErrMalformed, truncate(f[2], 100))
		}
	}
	return Command{Old: f[0], New: f[1], Ref: f[2]}, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// Encode renders the request for receive-pack with only cmds, which must
// not be empty: the capabilities ride on the first command sent, whichever
// it is.
func (r *Request) Encode(cmds []Command) []byte {
	var b []byte
	for _, s := range r.Shallow {
		b, _ = pktline.Append(b, []byte("shallow "+s))
	}
	for i, c := range cmds {
		line := c.Old + " " + c.New + " " + c.Ref
		if i == 0 {
			line += "\x00" + r.Caps
		}
		b, _ = pktline.Append(b, []byte(line))
	}
	b = append(b, "0000"...)
	if r.HasCap("push-options") {
		for _, o := range r.Options {
			b, _ = pktline.Append(b, []byte(o))
		}
		b = append(b, "0000"...)
	}
	return b
}

// BufferedReader is the reader ReadRequest should be given so that the
// pack after the request can be relayed with no byte lost.
func BufferedReader(r io.Reader) *bufio.Reader { return bufio.NewReaderSize(r, 64<<10) }
