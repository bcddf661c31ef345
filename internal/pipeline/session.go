package pipeline

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"packwire/internal/fetchcache"
	"packwire/internal/gitexec"
	"packwire/internal/pktline"
	"packwire/internal/protocol"
)

// servesV2Session tells whether a git:// or SSH upload-pack session of
// protocol v2 is served without a session git (runV2Session): with the
// fetch cache on, every command goes through a cache first.
func (c *Call) servesV2Session() bool {
	req := c.Request
	return c.gated && c.p.FetchCache != nil && req.Service == gitexec.UploadPack && !req.StatelessRPC &&
		protocol.Version(req.Protocol) == 2 && c.route.Relay == nil
}

// runV2Session serves a protocol v2 upload-pack session of git:// or SSH
// without a git of its own. Protocol v2 keeps no state between commands
// (smart HTTP runs each in its own `upload-pack --stateless-rpc`, and
// git's session process answers each the same way), so packwire speaks
// the session itself: the capability advertisement and ls-refs answers
// come from the answer cache, fetch commands from the fetch cache, and
// git runs statelessly only for what no cache has. A CI runner's fetch
// after a push then costs no git of its own: before, each runner's session
// git (its advertisement and ls-refs, ~4 ms of spawning) dominated a herd
// whose pack was generated once.
//
// plain is the session's git (without the pack-objects hook), spec the
// one a fetch runs. The session ends at the client's flush or EOF, or
// after a command git failed (a session git would have died of it).
//
// clientIn is the transport's stream under stdin (which may be a tap of
// it), for its read deadline.
func (c *Call) runV2Session(ctx context.Context, plain, spec gitexec.Spec, clientIn, stdin io.Reader, stdout, stderr io.Writer) (gitexec.Result, error) {
	var total sideRuns
	// Reads from the client end with the request: an idle or too slow
	// client, a shutdown. A net.Conn has read deadlines; an SSH channel
	// is closed through its write deadline.
	unblock := func(time.Time) error { return nil }
	if d, ok := clientIn.(ReadDeadliner); ok {
		unblock = d.SetReadDeadline
	} else if d, ok := stdout.(gitexec.WriteDeadliner); ok {
		unblock = d.SetWriteDeadline
	}
	defer gitexec.DeadlineOnCancel(ctx, unblock)()

	advertise := plain
	advertise.StatelessRPC, advertise.AdvertiseRefs = true, true
	res, err := c.runCapabilities(ctx, advertise, stdout, stderr)
	total.add(res)
	if err != nil || res.ExitCode != 0 {
		return total.fold(gitexec.Result{}), err
	}
	stateless := spec
	stateless.StatelessRPC = true
	plain.StatelessRPC = true
	// Waiting for a command ends at the idle timeout (Run's idleWatch).
	client := bufio.NewReaderSize(stdin, 64<<10)
	for {
		body, err := c.readCommand(ctx, client, readDeadliner(unblock), stdout, stderr)
		if errors.Is(err, errBadPktLine) {
			total.add(gitexec.Result{ExitCode: 128}) // as git dies of it
		}
		if body == nil || err != nil {
			if errors.Is(err, io.EOF) {
				err = nil // the client ended the session
			}
			if ctx.Err() != nil {
				err = context.Cause(ctx)
			}
			return total.fold(gitexec.Result{}), err
		}
		res, err := c.v2Command(ctx, plain, stateless, body, stdout, stderr)
		body.close()
		total.add(res)
		if err != nil || res.ExitCode != 0 {
			return total.fold(gitexec.Result{}), err
		}
	}
}

// v2Command answers one whole command of a v2 session.
func (c *Call) v2Command(ctx context.Context, plain, stateless gitexec.Spec, body *requestBody, stdout, stderr io.Writer) (gitexec.Result, error) {
	var cmd fetchcache.Command
	var err error
	if body.file == nil {
		cmd, err = fetchcache.InspectCommand(body.mem)
	}
	if isBundleURICommand(firstCommand(body)) {
		return c.runBundleURI(body, stdout)
	}
	if perr := c.p.refusedCommand(firstCommand(body)); perr != nil {
		pktline.WriteError(stdout, perr.Message)
		return gitexec.Result{BytesIn: body.size}, perr
	}
	switch {
	case err == nil && cmd.Name == "ls-refs":
		return c.runLsRefs(ctx, plain, body.mem, cmd.Key, stdout, stderr)
	case body.file != nil || cmd.Name == "fetch":
		filtered, ferr := c.withoutUnreachableHaves(ctx, body)
		if ferr != nil {
			return gitexec.Result{}, ferr
		}
		if filtered != body {
			// body was closed: emptied, the caller's close is a no-op.
			defer filtered.close()
			*body = requestBody{}
			body = filtered
		}
		if err := c.checkWants(ctx, pktLines(body.reader())); err != nil {
			var perr *Error
			errors.As(err, &perr)
			pktline.WriteError(stdout, perr.Message)
			return gitexec.Result{BytesIn: body.size}, err
		}
		var res gitexec.Result
		var err error
		if body.file == nil && cmd.Name == "fetch" {
			res, err = c.runFetch(ctx, stateless, body.mem, stdout, stderr)
		} else {
			res, err = c.runUncached(ctx, stateless, body.reader(), stdout, stderr)
		}
		if perr := (*Error)(nil); errors.As(err, &perr) {
			// Refused a slot (server busy), before anything was sent: in
			// git's words.
			pktline.WriteError(stdout, perr.Message)
		}
		return res, err
	default:
		// Another command (object-info, when served), or one git will
		// refuse in its own words: no pack, no slot.
		return c.startGit(ctx, plain, body.reader(), stdout, stderr)
	}
}

// readCommand reads the session's next command whole (to its flush) under
// the pipeline's Pace, which starts at its first byte: waiting for a
// command is the idle timeout's. It returns nil at the end of the session
// (a flush alone, or EOF before a command). A packet that is not one
// ends the session as it ends git's (serve.c dies of it): in git's words,
// as an ERR packet and, over SSH, on stderr.
func (c *Call) readCommand(ctx context.Context, client *bufio.Reader, unblock readDeadliner, stdout, stderr io.Writer) (*requestBody, error) {
	first, err := client.Peek(4)
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || len(first) > 0 && errors.Is(err, io.EOF) {
			return nil, io.ErrUnexpectedEOF
		}
		return nil, err
	}
	if string(first) == "0000" {
		client.Discard(4)
		return nil, nil
	}
	body, err := c.readRequest(ctx, &commandReader{r: client}, unblock)
	if bad := (*badPktLine)(nil); errors.As(err, &bad) {
		c.p.log().Info("refused", "id", c.ID, "transport", c.Request.Transport, "repo", c.Repo.Name, "user", c.Request.Principal.String(), "reason", bad.Error())
		if stderr != nil {
			fmt.Fprintf(stderr, "fatal: %s\n", bad)
		}
		err = &Error{Code: CodeBadRequest, Message: bad.Error(), Err: bad}
	}
	var perr *Error
	if errors.As(err, &perr) {
		pktline.WriteError(stdout, perr.Message) // too slow, or not a packet: in git's words
	}
	return body, err
}

// commandReader passes on the client's packets up to and including the
// flush that ends a v2 command, then reports EOF. A length that is not a
// packet's ends the command with a *badPktLine, its 4 bytes left unread:
// nothing after them can be framed.
type commandReader struct {
	r    *bufio.Reader
	left int // bytes of the current packet not passed on yet
	done bool
}

func (c *commandReader) Read(p []byte) (int, error) {
	if c.done {
		return 0, io.EOF
	}
	if c.left == 0 {
		head, err := c.r.Peek(4)
		if err != nil {
			if len(head) > 0 && errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
		n, perr := pktline.ParseLength(head)
		switch {
		case perr != nil || n == 3 || n > pktline.MaxLength:
			c.done = true
			return 0, &badPktLine{head: string(head), n: n, parsed: perr == nil}
		case n == 0:
			c.done = true
			c.left = 4
		default:
			c.left = max(n, 4)
		}
	}
	n, err := c.r.Read(p[:min(len(p), c.left)])
	c.left -= n
	if c.done && c.left == 0 && err == nil {
		return n, nil // the flush: EOF comes with the next read
	}
	return n, err
}

// badPktLine is a length prefix no packet has, as the client sent it.
type badPktLine struct {
	head   string
	n      int  // the length, if parsed
	parsed bool // four hex digits, of a length no packet has (1-3, too large)
}

// errBadPktLine matches every *badPktLine (errors.Is).
var errBadPktLine = errors.New("bad pkt-line")

// Error is git's message for it (pkt-line.c).
func (b *badPktLine) Error() string {
	switch {
	case !b.parsed:
		return "protocol error: bad line length character: " + printable(b.head)
	case b.n < 4:
		return fmt.Sprintf("protocol error: bad line length %d", b.n)
	default:
		return fmt.Sprintf("protocol error: bad line length %d", b.n-4) // git counts the payload
	}
}

func (b *badPktLine) Is(target error) bool { return target == errBadPktLine }

// IsProtocolError reports whether a call ended because the client sent a
// packet no git client sends (a malformed pkt-line length): the
// transports penalize its address for it (accept.Penalties).
func IsProtocolError(err error) bool { return errors.Is(err, errBadPktLine) }

// readDeadliner gives readRequest the session's way to end a blocked read.
type readDeadliner func(time.Time) error

func (r readDeadliner) SetReadDeadline(t time.Time) error { return r(t) }
func (r readDeadliner) Write(b []byte) (int, error)       { return len(b), nil }
