package ssh

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"packwire/internal/access"
	"packwire/internal/gitexec"
	"packwire/internal/pipeline"
	"packwire/internal/pktline"
	"packwire/internal/transport/accept"
)

const (
	invalidCommandRefusal = "fatal: invalid command: packwire only runs git-upload-pack, git-receive-pack or git-upload-archive with one repository path\n"
)

// Exit statuses of sessions in which git did not run to the end.
const (
	exitRefused   = 128 // what git itself exits with when it dies
	exitShell     = 1
	exitRelayFail = 1 // the relay failed and git left no exit code of its own
)

// serveSession answers a session channel's requests: GIT_PROTOCOL, then one
// exec. It keeps reading requests while the command runs, since an
// unserviced request channel stalls the whole connection.
func (c *conn) serveSession(ch gossh.Channel, reqs <-chan *gossh.Request) {
	var (
		protocol string
		started  bool
		done     = make(chan struct{})
	)
	for req := range reqs {
		switch req.Type {
		case "env":
			var kv struct{ Name, Value string }
			ok := !started && gossh.Unmarshal(req.Payload, &kv) == nil && kv.Name == "GIT_PROTOCOL"
			if ok {
				protocol = kv.Value
			}
			req.Reply(ok, nil)
		case "exec", "shell":
			var cmd struct{ Command string }
			if started || req.Type == "exec" && gossh.Unmarshal(req.Payload, &cmd) != nil {
				req.Reply(false, nil)
				continue
			}
			started = true
			req.Reply(true, nil)
			c.beginCommand()
			go func(shell bool, command, protocol string) {
				defer close(done)
				defer c.endCommand()
				var status uint32
				switch refusal := c.checkKey(); {
				case refusal != "":
					// Before any git runs, the greeting included: the key
					// may have been removed since the connection began.
					c.log.Info("refused", "reason", refusal)
					if !shell {
						pktline.WriteError(ch, refusal)
					}
					fmt.Fprintf(ch.Stderr(), "fatal: %s\n", refusal)
					status = exitRefused
				case shell:
					status = c.refuseShell(ch)
				default:
					status = c.exec(ch, command, protocol)
				}
				finish(ch, status)
			}(req.Type == "shell", cmd.Command, protocol)
		default: // pty-req, subsystem, x11-req, auth-agent-req, window-change, signal...
			req.Reply(false, nil)
		}
	}
	if started {
		<-done
	}
}

// finish ends a session so that the client always learns an exit status:
// exit-status, EOF, close. The status goes first: an OpenSSH client closes a
// session channel as soon as it has sent and received EOF, and once its
// close arrives x/crypto/ssh closes the channel too and drops any request
// still to be sent. With EOF first, a fast client (an OpenSSH ControlMaster
// on loopback) sometimes closed in between; its mux client then got no
// status, exited 255, and git called a complete fetch "remote transport
// reported error".
func finish(ch gossh.Channel, status uint32) {
	ch.SendRequest("exit-status", false, gossh.Marshal(struct{ Status uint32 }{status}))
	ch.CloseWrite()
	ch.Close()
}

func (c *conn) refuseShell(ch gossh.Channel) uint32 {
	c.log.Info("refused", "reason", "interactive shell requested")
	fmt.Fprint(ch.Stderr(), greeting(c.principal, c.keyFingerprint))
	return exitShell
}

// greeting is what "ssh git@host" prints, as the big hosts do: who the key
// makes you, so that a user whose key is not registered learns it before a
// push fails, with the fingerprint an admin needs.
func greeting(p access.Principal, fingerprint string) string {
	switch {
	case !p.IsAnonymous():
		return fmt.Sprintf("Hi %s! You are authenticated to packwire; shell access is not provided.\n", p.User)
	case fingerprint != "":
		return fmt.Sprintf("Hi! Your key %s is not registered with packwire, so you are anonymous here:\n"+
			"you may read what anonymous users may and push nothing (an admin registers a key with\n"+
			"packwire key add USER KEY.pub). Shell access is not provided.\n", fingerprint)
	default:
		return "Hi! You offered no SSH key, so you are anonymous here: you may read what\n" +
			"anonymous users may and push nothing. Shell access is not provided.\n"
	}
}

// exec runs one git command through the pipeline and returns the exit
// status to report.
func (c *conn) exec(ch gossh.Channel, command, protocol string) uint32 {
	if c.srv.LFS != nil && c.srv.LFS.IsSSHCommand(command) && c.unavailable == "" {
		return c.srv.LFS.ServeSSH(c.ctx, c.principal, c.remote, command, ch, ch, ch.Stderr())
	}
	service, path, err := ParseCommand(command)
	if err != nil {
		c.log.Info("refused", "reason", "invalid command", "command", truncate(command, 200))
		fmt.Fprint(ch.Stderr(), invalidCommandRefusal)
		return exitRefused
	}
	svc, _ := gitexec.ParseService(service)
	if c.unavailable != "" {
		perr := pipeline.StoreUnavailable(errors.New(c.unavailable))
		c.log.Warn("refused", "reason", perr.Message, "cause", c.unavailable, "command", truncate(command, 200))
		pktline.WriteError(ch, perr.Message)
		fmt.Fprintf(ch.Stderr(), "fatal: %s\n", perr.Message)
		return exitRefused
	}
	call, err := c.srv.Pipeline.Prepare(c.ctx, pipeline.Request{
		Transport: "ssh",
		Service:   svc,
		RepoPath:  path,
		Protocol:  protocol,
		Principal: c.principal,
		Remote:    c.remote,
	})
	if err != nil {
		// The pipeline has logged the refusal. git shows the ERR pkt-line as
		// "fatal: remote error: ..."; stderr is for a human running ssh.
		msg := "internal error"
		if perr := (*pipeline.Error)(nil); errors.As(err, &perr) {
			msg = perr.Message
		}
		pktline.WriteError(ch, msg)
		fmt.Fprintf(ch.Stderr(), "fatal: %s\n", msg)
		return exitRefused
	}
	// c.ctx ends with the connection; a closed channel ends the relay
	// through the failed write, and the client's EOF reaches git's stdin.
	paced := newPacedWriter(ch, c.srv.maxUnacked())
	if paced.window == nil && c.srv.maxUnacked() > 0 {
		c.srv.pacingOff.Do(func() {
			c.log.Warn("output pacing is off", "reason", "x/crypto/ssh's channel window was not found (its layout changed)")
		})
	}
	stopRTT := c.measureRTT(paced)
	out := &channelWriter{pacedWriter: paced, closeConn: func() {
		c.log.Info("connection closed", "reason", "the client answered neither its data nor the channel's close", "grace", closeGrace.String())
		c.ssh.Close()
	}}
	out.idle = call.IdleTimeout()
	defer out.SetWriteDeadline(time.Time{})
	res, err := call.Run(c.ctx, ch, out, ch.Stderr())
	stopRTT()
	if paced.stalled() {
		c.log.Info("output pacing stopped", "service", service, "repo", path, "reason", "the client returned no window for "+stallWait.String()+" while output waited")
	}
	if err != nil {
		c.log.Info("request ended early", "service", service, "repo", path, "error", err.Error())
	}
	if pipeline.IsProtocolError(err) {
		c.srv.Penalties.Offend(c.ssh.RemoteAddr(), accept.CostProtocol, "malformed packet")
	}
	// -1: git was killed; 0 after a failed relay: the client did not get it all.
	if res.ExitCode < 0 || err != nil && res.ExitCode == 0 {
		return exitRelayFail
	}
	return uint32(res.ExitCode)
}

// channelWriter is git's stdout into a session channel, paced (see
// pacedWriter), with the write deadline the relay and fetch cache replays
// use to unblock a write stuck on a client that stopped reading: an SSH
// channel has no deadlines, so the channel is closed when the deadline
// passes (at once for one in the past). A zero time clears it, as for a
// net.Conn: a replay sets one before each write and clears it when done,
// and the session goes on.
//
// Closing the channel does not wake a write that waits for the client's
// window or TCP buffer (x/crypto/ssh wakes it when the client answers the
// close); a client that reads nothing answers nothing, so closeConn ends
// the whole connection closeGrace later if the deadline is still set then.
type channelWriter struct {
	pacedWriter
	idle      time.Duration // write deadline of each chunk a file is sent in (ServeFile...); 0: none
	closeConn func()        // closes the connection; nil: the channel's close is all
	mu        sync.Mutex
	timer     *time.Timer
	grace     *time.Timer
	deadlines int // counts SetWriteDeadline calls: a timer that fired late sees a newer one
}

// closeGrace is how long a client has to answer its channel's close, once
// a write deadline closed it, before its connection is closed.
const closeGrace = 5 * time.Second

// ServeFile sends a whole response of known size from f (a fetch cache
// replay; see fetchcache.FileServer): unpaced up to unpacedMax (see
// pacedWriter), paced above.
func (c *channelWriter) ServeFile(f *os.File, size int64) (int64, error) {
	return c.copyKnown(io.NewSectionReader(f, 0, size), size)
}

// StreamDone sends the next n bytes of f from its offset, a stretch known
// to be whole (of a recorded protocol v0 session that ended;
// fetchcache.DoneStreamer): as ServeFile.
func (c *channelWriter) StreamDone(f *os.File, n int64) (int64, error) {
	return c.copyKnown(io.LimitReader(f, n), n)
}

// StreamFile sends the next n bytes of f from its offset as they come (a
// run in progress; fetchcache.FileStreamer), paced: the size of the whole
// is not known.
func (c *channelWriter) StreamFile(f *os.File, n int64) (int64, error) {
	return c.copyFile(c.Write, io.LimitReader(f, n))
}

// copyKnown sends the n bytes of r, the whole of what is to be sent:
// unpaced up to unpacedMax.
func (c *channelWriter) copyKnown(r io.Reader, n int64) (int64, error) {
	if n <= unpacedMax {
		return c.copyFile(c.pacedWriter.writeUnpaced, r)
	}
	return c.copyFile(c.Write, r)
}

// copyFile sends r through write in the relay's buffers, each write under
// the idle write deadline, as the fetch cache's own copy does: a client
// that stops reading has its channel closed.
func (c *channelWriter) copyFile(write func([]byte) (int, error), r io.Reader) (int64, error) {
	bufp := gitexec.CopyBuffers.Get().(*[]byte)
	defer gitexec.CopyBuffers.Put(bufp)
	buf := *bufp
	var sent int64
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			if c.idle > 0 {
				c.SetWriteDeadline(time.Now().Add(c.idle))
			}
			m, err := write(buf[:n])
			sent += int64(m)
			if err != nil {
				return sent, err
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return sent, rerr
		}
	}
	if c.idle > 0 {
		c.SetWriteDeadline(time.Time{})
	}
	return sent, nil
}

func (c *channelWriter) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadlines++
	for _, timer := range []**time.Timer{&c.timer, &c.grace} {
		if *timer != nil {
			(*timer).Stop()
			*timer = nil
		}
	}
	d := time.Until(t)
	switch {
	case t.IsZero():
	case d <= 0:
		c.armGrace()
	default:
		set := c.deadlines
		c.timer = time.AfterFunc(d, func() {
			c.mu.Lock()
			if c.deadlines != set { // cleared or moved while this timer fired
				c.mu.Unlock()
				return
			}
			c.armGrace()
			c.mu.Unlock()
			c.Channel.Close() // may block on a full TCP buffer: the grace timer runs anyway
		})
	}
	c.mu.Unlock()
	if !t.IsZero() && d <= 0 {
		return c.Channel.Close()
	}
	return nil
}

// armGrace starts the wait for the client's answer to the channel's close;
// c.mu is held.
func (c *channelWriter) armGrace() {
	if c.closeConn != nil && c.grace == nil {
		c.grace = time.AfterFunc(closeGrace, c.closeConn)
	}
}

// rttInterval is how often a session's round trip is measured again while
// its command runs.
const rttInterval = 2 * time.Second

// measureRTT times keepalive@openssh.com round trips for out's pacing: one
// now, then every rttInterval until the returned stop is called. A client
// that never answers leaves the session unpaced.
func (c *conn) measureRTT(out pacedWriter) (stop func()) {
	if out.window == nil {
		return func() {}
	}
	done := make(chan struct{})
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		t := time.NewTicker(rttInterval)
		defer t.Stop()
		for {
			start := time.Now()
			// Any answer counts, a refusal included (OpenSSH refuses it).
			if _, _, err := c.ssh.SendRequest("keepalive@openssh.com", true, nil); err != nil {
				return
			}
			out.setRTT(time.Since(start))
			select {
			case <-done:
				return
			case <-c.ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() { close(done) }
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
