package fetchcache

import "bytes"

// Command is one whole protocol v2 command as a client sent it.
type Command struct {
	Name string // "ls-refs", "fetch", "object-info", ...
	// Key is the command without its agent= capability: git's answer does
	// not depend on it (serve.c only records it), so clients of different
	// versions share answers. Everything else is kept in the client's order.
	Key []byte
	// Args are the argument packets' payloads (after the delimiter),
	// without their newline, in order; they point into the body.
	Args [][]byte
}

// InspectCommand parses body as exactly one protocol v2 command: a
// "command=NAME" packet, capability packets, optionally a delimiter and
// argument packets, a flush, and nothing after. It says nothing about
// whether the command's answer may be kept; the caller decides by Name.
func InspectCommand(body []byte) (Command, error) {
	const (
		command = iota
		capabilities
		arguments
		ended
	)
	state := command
	var cmd Command
	key := make([]byte, 0, len(body))
	for len(body) > 0 {
		if state == ended {
			return Command{}, ErrMalformed // a second command, or trailing bytes
		}
		p, rest, err := nextPacket(body)
		if err != nil {
			return Command{}, err
		}
		body = rest
		switch {
		case p.n == 0:
			if state == command {
				return Command{}, ErrMalformed // a flush alone ends a session: no command
			}
			state = ended
		case p.n == 1:
			if state != capabilities {
				return Command{}, ErrMalformed
			}
			state = arguments
		case p.n == 2:
			return Command{}, ErrMalformed // response-end is for servers
		case state == command:
			name, ok := bytes.CutPrefix(p.line, []byte("command="))
			if !ok || len(name) == 0 {
				return Command{}, ErrMalformed
			}
			cmd.Name = string(name)
			state = capabilities
		case state == capabilities:
			if bytes.HasPrefix(p.line, []byte("command=")) {
				return Command{}, ErrMalformed
			}
			if bytes.HasPrefix(p.line, []byte("agent=")) {
				continue // not part of the key
			}
		case state == arguments:
			cmd.Args = append(cmd.Args, p.line)
		}
		key = append(key, p.raw...)
	}
	if state != ended {
		return Command{}, ErrMalformed
	}
	cmd.Key = key
	return cmd, nil
}
