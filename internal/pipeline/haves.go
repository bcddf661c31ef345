package pipeline

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"packwire/internal/gitexec"
	"packwire/internal/pktline"
	"packwire/internal/reach"
)

// Haves and object-info: what a client may learn of objects without
// fetching them. upload-pack ACKs a "have" of any object it has, and v2's
// object-info tells the size of any object by id; both would confirm that
// an object no visible ref reaches (a deleted branch's commit, a secret's
// blob) is still stored. So the haves of objects no visible ref reaches
// are dropped before git sees them (git then neither ACKs them nor counts
// them common: the pack is as if the client had not said it), and
// object-info is neither advertised nor answered unless the pipeline's
// ObjectInfo says so.

// maxHaveBatch bounds the have lines haveFilter holds before asking about
// them: a client sends a flush (or done) after a few dozen in each round.
const maxHaveBatch = 1024

// haveFilter passes a client's pkt-line stream on without the have lines
// that drop names (Call.unreachableHaves). Consecutive have lines are held
// until the packet after them (a flush, done) or maxHaveBatch, then asked
// about at once; every other packet passes as it comes. From the first
// bytes that are not a pkt-line on, everything passes (git refuses it).
type haveFilter struct {
	r     io.Reader
	drop  func(haves []string) map[string]bool
	scan  []byte   // read, not yet a whole packet
	out   []byte   // for the reader
	batch [][]byte // held have packets
	raw   bool
	err   error // the stream's, returned once out is empty
	buf   []byte
}

func newHaveFilter(r io.Reader, drop func([]string) map[string]bool) *haveFilter {
	return &haveFilter{r: r, drop: drop}
}

func (f *haveFilter) Read(p []byte) (int, error) {
	for {
		if len(f.out) > 0 {
			n := copy(p, f.out)
			f.out = f.out[n:]
			return n, nil
		}
		if f.err != nil {
			return 0, f.err
		}
		if f.raw {
			return f.r.Read(p)
		}
		if f.buf == nil {
			f.buf = make([]byte, 32<<10)
		}
		n, err := f.r.Read(f.buf)
		f.scan = append(f.scan, f.buf[:n]...)
		f.parse()
		if err != nil {
			// The stream ended: what was held goes on as it is asked about.
			f.release()
			f.out = append(f.out, f.scan...)
			f.scan, f.err = nil, err
		}
	}
}

// parse moves the whole packets of scan to out, holding have lines.
func (f *haveFilter) parse() {
	for !f.raw && len(f.scan) >= 4 {
		n, err := pktline.ParseLength(f.scan[:4])
		if err != nil || n == 3 || n > pktline.MaxLength {
			f.release()
			f.raw = true
			f.out = append(f.out, f.scan...)
			f.scan = nil
			return
		}
		size := max(n, 4)
		if len(f.scan) < size {
			return
		}
		pkt := f.scan[:size:size]
		f.scan = f.scan[size:]
		if _, ok := reach.HaveID(string(pkt[4:])); ok && n > 4 {
			f.batch = append(f.batch, pkt)
			if len(f.batch) >= maxHaveBatch {
				f.release()
			}
			continue
		}
		f.release()
		f.out = append(f.out, pkt...)
	}
}

// release passes on the held have lines but those to drop.
func (f *haveFilter) release() {
	if len(f.batch) == 0 {
		return
	}
	ids := make([]string, len(f.batch))
	for i, pkt := range f.batch {
		ids[i], _ = reach.HaveID(string(pkt[4:]))
	}
	drop := f.drop(ids)
	for i, pkt := range f.batch {
		if !drop[ids[i]] {
			f.out = append(f.out, pkt...)
		}
	}
	f.batch = f.batch[:0]
}

// unreachableHaves tells which of haves to drop (reach.Checker); on an
// error, all of them: a have is only a hint, and an object must not be
// confirmed because the check failed.
func (c *Call) unreachableHaves(ctx context.Context, haves []string) map[string]bool {
	drop := map[string]bool{}
	unreachable, usage, err := c.p.Reach.UnreachableHaves(ctx, c.Repo.Path, haves)
	c.checkUser.Add(int64(usage.User))
	c.checkSys.Add(int64(usage.Sys))
	if err != nil {
		c.p.log().Warn("checking haves; all of them left out", "id", c.ID, "repo", c.Repo.Name, "error", err.Error())
		unreachable = haves
	}
	for _, id := range unreachable {
		drop[id] = true
	}
	if len(unreachable) > 0 && err == nil {
		c.p.log().Info("haves left out", "id", c.ID, "transport", c.Request.Transport, "repo", c.Repo.Name,
			"user", c.Request.Principal.String(), "reason", "objects no visible ref reaches", "object", unreachable[0], "count", len(unreachable))
	}
	return drop
}

// filtersHaves tells whether the call's client stream goes through a
// haveFilter.
func (c *Call) filtersHaves() bool {
	return c.p.Reach != nil && c.Request.Service == gitexec.UploadPack
}

// haveFiltered returns r through a haveFilter when the call filters haves.
func (c *Call) haveFiltered(ctx context.Context, r io.Reader) io.Reader {
	if !c.filtersHaves() {
		return r
	}
	return newHaveFilter(r, func(haves []string) map[string]bool { return c.unreachableHaves(ctx, haves) })
}

// withoutUnreachableHaves returns a whole request body without the have
// lines of objects no visible ref reaches: body itself when there are
// none to drop, else a new body (and body is closed).
func (c *Call) withoutUnreachableHaves(ctx context.Context, body *requestBody) (*requestBody, error) {
	if !c.filtersHaves() || !bytes.Contains(body.mem, []byte("have ")) && body.file == nil {
		return body, nil
	}
	haves := reach.Haves(pktLines(body.reader()))
	if len(haves) == 0 {
		return body, nil
	}
	drop := c.unreachableHaves(ctx, haves)
	if len(drop) == 0 {
		return body, nil
	}
	filtered := newHaveFilter(body.reader(), func([]string) map[string]bool { return drop })
	out := &requestBody{}
	var err error
	if body.file == nil {
		out.mem, err = io.ReadAll(filtered)
		out.size = int64(len(out.mem))
	} else {
		// Within the Spool's bounds, as the body it replaces.
		var f *os.File
		if f, err = os.CreateTemp(c.p.TempDir, "request-*"); err == nil {
			out.file = &spoolFile{f: f, spool: c.p.Spool, addr: remoteHost(c.Request.Remote)}
			out.size, err = io.Copy(out.file, filtered)
		}
	}
	body.close()
	if err != nil {
		out.close()
		return nil, err
	}
	return out, nil
}

// ErrObjectInfoOff is the cause of a refused object-info command.
var ErrObjectInfoOff = errors.New("object-info is off (--object-info)")

// refusedCommand returns the refusal of a v2 command line the pipeline
// does not serve (object-info unless ObjectInfo), in the words git uses
// for a command it does not advertise; nil for any other.
func (p *Pipeline) refusedCommand(line string) *Error {
	if !p.ObjectInfo && strings.TrimSuffix(line, "\n") == "command=object-info" {
		return &Error{Code: CodeBadRequest, Message: "invalid command 'object-info'", Err: ErrObjectInfoOff}
	}
	return nil
}

// firstCommand is the first packet of a v2 request body, if whole.
func firstCommand(body *requestBody) string {
	_, line, err := pktline.NewReader(body.reader()).Read()
	if err != nil {
		return ""
	}
	return string(line)
}

// capabilityFilter drops the object-info line from a v2 capability
// advertisement (git's output to its first flush) and adds packwire's
// own (bundle-uri) before that flush, on its way to the client;
// everything after that passes as it is written. Writes may come from
// git's relay and from a refusal at once (the admission gate's).
type capabilityFilter struct {
	mu             sync.Mutex
	w              io.Writer
	dropObjectInfo bool
	add            []byte // packets to advertise too
	head           []byte // the advertisement's packets not yet whole
	done           bool
}

func (f *capabilityFilter) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done {
		return f.w.Write(p)
	}
	f.head = append(f.head, p...)
	var out []byte
	for len(f.head) >= 4 {
		n, err := pktline.ParseLength(f.head[:4])
		if err != nil || n == 3 || n > pktline.MaxLength {
			f.done = true // not an advertisement: passed as it is
			break
		}
		size := max(n, 4)
		if len(f.head) < size {
			break
		}
		pkt := f.head[:size]
		f.head = f.head[size:]
		name, _, _ := strings.Cut(strings.TrimSuffix(string(pkt[4:]), "\n"), "=")
		if n == 0 {
			out = append(out, f.add...)
		}
		if n <= 4 || name != "object-info" || !f.dropObjectInfo {
			out = append(out, pkt...)
		}
		if n == 0 {
			f.done = true
			break
		}
	}
	if f.done {
		out = append(out, f.head...)
		f.head = nil
	}
	if len(out) > 0 {
		if _, err := f.w.Write(out); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

func (f *capabilityFilter) SetWriteDeadline(t time.Time) error {
	if d, ok := f.w.(gitexec.WriteDeadliner); ok {
		return d.SetWriteDeadline(t)
	}
	return nil
}
