package lfs

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"packwire/internal/access"
	"packwire/internal/governor"
	"packwire/internal/pktline"
	"packwire/internal/repo"
)

// git-lfs-transfer NAME upload|download: LFS over SSH alone (git-lfs's
// docs/proposals/ssh_adapter.md, which git-lfs 3 tries before
// git-lfs-authenticate). pkt-lines: the server advertises version=1, then
// answers commands (version, batch, get-object, put-object,
// verify-object, quit) with "status NNN", arguments, and after a delim
// either data or an error message, then a flush. Locking is not
// advertised, so git-lfs asks the HTTP locks API for those.

// transferSession is one git-lfs-transfer command's connection.
type transferSession struct {
	s      *Service
	ctx    context.Context
	p      access.Principal
	remote string
	repo   repo.Repo
	op     string
	in     *pktline.Reader
	out    *bufio.Writer
}

func (s *Service) transfer(ctx context.Context, p access.Principal, remote string, r repo.Repo, op string, stdin io.Reader, stdout io.Writer) uint32 {
	t := &transferSession{s: s, ctx: ctx, p: p, remote: remote, repo: r, op: op,
		in: pktline.NewReader(bufio.NewReaderSize(stdin, 64<<10)), out: bufio.NewWriterSize(stdout, 64<<10)}
	pktline.Writef(t.out, "version=1\n")
	pktline.WriteFlush(t.out)
	if t.out.Flush() != nil {
		return 1
	}
	for {
		kind, line, err := t.in.Read()
		if err == io.EOF {
			return 0
		}
		if err != nil || kind != pktline.Data {
			return 1
		}
		cmd := strings.TrimSuffix(string(line), "\n")
		args, delim, err := t.readArgs()
		if err != nil {
			return 1
		}
		quit := false
		switch name, arg, _ := strings.Cut(cmd, " "); {
		case name == "version":
			t.status(200, nil)
		case name == "quit":
			t.status(200, nil)
			quit = true
		case name == "batch" && delim:
			err = t.batch(args)
		case name == "get-object" && t.op == "download":
			t.getObject(arg, args)
		case name == "put-object" && t.op == "upload" && delim:
			err = t.putObject(arg, args)
		case name == "verify-object" && t.op == "upload":
			t.verifyObject(arg, args)
		case name == "lock" || name == "unlock":
			if delim {
				err = t.skipData()
			}
			t.lock(name, arg, args)
		case name == "list-lock" || name == "list-locks":
			t.listLocks(name == "list-locks", args)
		default:
			if delim {
				err = t.skipData()
			}
			t.fail(http.StatusBadRequest, fmt.Sprintf("unknown command %q for a %s session", name, t.op))
		}
		if err != nil || t.out.Flush() != nil {
			return 1
		}
		if quit {
			return 0
		}
	}
}

// readArgs reads "key=value" packets up to a delim (delim true: data or
// lines follow) or a flush.
func (t *transferSession) readArgs() (args map[string]string, delim bool, err error) {
	args = map[string]string{}
	for {
		kind, line, err := t.in.Read()
		if err != nil {
			return nil, false, err
		}
		switch kind {
		case pktline.Flush:
			return args, false, nil
		case pktline.Delim:
			return args, true, nil
		case pktline.Data:
			k, v, _ := strings.Cut(strings.TrimSuffix(string(line), "\n"), "=")
			args[k] = v
		default:
			return nil, false, errors.New("unexpected packet")
		}
	}
}

// lines reads text packets up to the flush.
func (t *transferSession) lines() ([]string, error) {
	var out []string
	for {
		kind, line, err := t.in.Read()
		if err != nil {
			return nil, err
		}
		if kind == pktline.Flush {
			return out, nil
		}
		out = append(out, strings.TrimSuffix(string(line), "\n"))
	}
}

// skipData reads packets up to the flush and drops them.
func (t *transferSession) skipData() error {
	_, err := io.Copy(io.Discard, &dataReader{in: t.in})
	return err
}

func (t *transferSession) status(code int, args []string) {
	pktline.Writef(t.out, "status %d\n", code)
	for _, a := range args {
		pktline.Writef(t.out, "%s\n", a)
	}
	pktline.WriteFlush(t.out)
}

// fail answers an error: status, delim, the message, flush.
func (t *transferSession) fail(code int, msg string) {
	pktline.Writef(t.out, "status %d\n", code)
	t.out.WriteString("0001")
	pktline.Writef(t.out, "%s\n", msg)
	pktline.WriteFlush(t.out)
}

func (t *transferSession) batch(args map[string]string) error {
	lines, err := t.lines()
	if err != nil {
		return err
	}
	if algo := args["hash-algo"]; algo != "" && algo != "sha256" {
		t.fail(http.StatusConflict, fmt.Sprintf("unsupported hash algorithm %q (sha256)", algo))
		return nil
	}
	if len(lines) > maxBatchObjects {
		t.fail(http.StatusRequestEntityTooLarge, fmt.Sprintf("too many objects in one batch (max %d)", maxBatchObjects))
		return nil
	}
	var answer []string
	var newBytes int64
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) < 2 {
			t.fail(http.StatusBadRequest, fmt.Sprintf("malformed batch line %q", l))
			return nil
		}
		oid := f[0]
		size, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			size = -1
		}
		if e := t.s.checkObject(oid, size); e != nil {
			t.fail(e.Code, e.Message)
			return nil
		}
		held, ok := t.heldSize(oid)
		action := "noop"
		switch {
		case t.op == "download" && ok && held == size:
			action = "download"
		case t.op == "upload" && !(ok && held == size):
			action = "upload"
			newBytes += size
		}
		answer = append(answer, fmt.Sprintf("%s %d %s", oid, size, action))
	}
	if newBytes > 0 {
		room, err := t.s.quotaRoom(t.ctx, t.repo)
		if err != nil {
			t.fail(http.StatusInternalServerError, "internal error reading the repository's quota")
			return nil
		}
		if room >= 0 && newBytes > room {
			t.fail(http.StatusInsufficientStorage, fmt.Sprintf("repository '%s' is over its quota: %d bytes of LFS objects to upload, %d bytes left", t.repo.Name, newBytes, room))
			return nil
		}
	}
	pktline.Writef(t.out, "status 200\n")
	pktline.Writef(t.out, "hash-algo=sha256\n")
	t.out.WriteString("0001")
	for _, a := range answer {
		pktline.Writef(t.out, "%s\n", a)
	}
	pktline.WriteFlush(t.out)
	return nil
}

// heldSize is the size the repository holds oid at, if it holds it and
// the content is there.
func (t *transferSession) heldSize(oid string) (int64, bool) {
	size, held, err := t.s.Index.Size(t.ctx, t.repo.Name, oid)
	if err != nil || !held {
		return 0, false
	}
	if _, stored := t.s.Objects.Stat(oid); !stored {
		return 0, false
	}
	return size, true
}

func (t *transferSession) getObject(oid string, _ map[string]string) {
	start := time.Now()
	if !ValidOID(oid) {
		t.fail(http.StatusUnprocessableEntity, "invalid object id: 64 lowercase hex digits expected")
		return
	}
	if _, ok := t.heldSize(oid); !ok {
		t.fail(http.StatusNotFound, "Object does not exist")
		return
	}
	f, fi, err := t.s.Objects.Open(oid)
	if err != nil {
		t.fail(http.StatusNotFound, "Object does not exist")
		return
	}
	defer f.Close()
	pktline.Writef(t.out, "status 200\n")
	pktline.Writef(t.out, "size=%d\n", fi.Size())
	t.out.WriteString("0001")
	buf := make([]byte, pktline.MaxPayload)
	var sent int64
	var werr error
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if werr = pktline.Write(t.out, buf[:n]); werr != nil {
				break
			}
			sent += int64(n)
		}
		if err != nil {
			break
		}
	}
	pktline.WriteFlush(t.out)
	result, errText := governor.ResultOK, ""
	if werr != nil {
		result, errText = governor.ResultClientGone, werr.Error()
	}
	t.s.record("lfs-download", "ssh", t.repo, t.p, t.remote, start, 0, sent, result, errText)
}

func (t *transferSession) putObject(oid string, args map[string]string) error {
	start := time.Now()
	data := &dataReader{in: t.in}
	size, err := strconv.ParseInt(args["size"], 10, 64)
	if err != nil {
		size = -1
	}
	refuse := func(code int, msg string) error {
		if _, err := io.Copy(io.Discard, data); err != nil {
			return err
		}
		t.fail(code, msg)
		return nil
	}
	if !ValidOID(oid) {
		return refuse(http.StatusUnprocessableEntity, "invalid object id: 64 lowercase hex digits expected")
	}
	if e := t.s.checkObject(oid, size); e != nil {
		return refuse(e.Code, e.Message)
	}
	if room, err := t.s.quotaRoom(t.ctx, t.repo); err != nil || room >= 0 && size > room {
		return refuse(http.StatusInsufficientStorage, fmt.Sprintf("repository '%s' is over its quota", t.repo.Name))
	}
	n, err := t.s.Objects.Put(oid, size, data)
	if err == nil {
		err = t.s.Index.Add(context.WithoutCancel(t.ctx), t.repo.Name, oid, size)
	}
	if data.err != nil { // the connection itself failed
		t.s.record("lfs-upload", "ssh", t.repo, t.p, t.remote, start, n, 0, governor.ResultClientGone, data.err.Error())
		return data.err
	}
	if err != nil {
		t.s.record("lfs-upload", "ssh", t.repo, t.p, t.remote, start, n, 0, governor.ResultRefused, err.Error())
		code := http.StatusInternalServerError
		if errors.Is(err, ErrSizeMismatch) || errors.Is(err, ErrHashMismatch) {
			code = http.StatusUnprocessableEntity
		}
		return refuse(code, err.Error())
	}
	t.s.record("lfs-upload", "ssh", t.repo, t.p, t.remote, start, n, 0, governor.ResultOK, "")
	if _, err := io.Copy(io.Discard, data); err != nil { // up to the flush after the data
		return err
	}
	t.status(200, nil)
	return nil
}

func (t *transferSession) verifyObject(arg string, args map[string]string) {
	oid, sizeText, _ := strings.Cut(arg, " ")
	if sizeText == "" {
		sizeText = args["size"]
	}
	size, err := strconv.ParseInt(sizeText, 10, 64)
	if !ValidOID(oid) || err != nil {
		t.fail(http.StatusUnprocessableEntity, "invalid object id or size")
		return
	}
	held, ok := t.heldSize(oid)
	switch {
	case !ok:
		t.fail(http.StatusNotFound, "Object does not exist")
	case held != size:
		t.fail(http.StatusUnprocessableEntity, fmt.Sprintf("Object %s is %d bytes, not %d", oid, held, size))
	default:
		t.status(200, nil)
	}
}

// dataReader reads the payloads of data packets up to a flush (then EOF;
// the flush is consumed). err keeps a failure of the connection itself.
type dataReader struct {
	in   *pktline.Reader
	rest []byte
	done bool
	err  error
}

func (d *dataReader) Read(p []byte) (int, error) {
	for len(d.rest) == 0 {
		if d.done {
			return 0, io.EOF
		}
		if d.err != nil {
			return 0, d.err
		}
		kind, line, err := d.in.Read()
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			d.err = err
			return 0, err
		}
		if kind != pktline.Data {
			d.done = true
			return 0, io.EOF
		}
		d.rest = line
	}
	n := copy(p, d.rest)
	d.rest = d.rest[n:]
	return n, nil
}

// lockArgs are a lock as the SSH protocol's lock answers carry it.
func lockArgs(l Lock) []string {
	return []string{"id=" + l.ID, "path=" + l.Path, "ownername=" + l.Owner, "locked-at=" + l.LockedAt.Format(time.RFC3339)}
}

func (t *transferSession) lock(name, id string, args map[string]string) {
	if t.op != "upload" {
		t.fail(http.StatusForbidden, "locks are made and removed in an upload session (write access)")
		return
	}
	if name == "lock" {
		path := args["path"]
		if path == "" || len(path) > 4096 {
			t.fail(http.StatusUnprocessableEntity, "a lock needs a path")
			return
		}
		l, err := t.s.Index.CreateLock(t.ctx, t.repo.Name, path, t.p.User)
		switch {
		case errors.Is(err, ErrLockExists):
			t.status(http.StatusConflict, lockArgs(l))
		case err != nil:
			t.fail(http.StatusServiceUnavailable, "temporarily unavailable: the LFS index did not answer")
		default:
			t.status(http.StatusCreated, lockArgs(l))
		}
		return
	}
	ls, err := t.s.Index.Locks(t.ctx, t.repo.Name, LockFilter{ID: id})
	if err != nil {
		t.fail(http.StatusServiceUnavailable, "temporarily unavailable: the LFS index did not answer")
		return
	}
	if len(ls) == 0 {
		t.fail(http.StatusNotFound, "unable to find lock")
		return
	}
	l := ls[0]
	// Another user's lock: an admin's to remove. Over HTTP the client
	// must also say force; git-lfs (3.3 and later: locking/ssh.go) never
	// sends force over SSH, so here the admin role alone decides, and
	// `git lfs unlock --force` by an admin works as over HTTP.
	if l.Owner != t.p.User {
		if _, aerr := t.s.authorize(t.ctx, t.p, t.repo.Name, needAdmin, false); aerr != nil {
			t.fail(http.StatusForbidden, fmt.Sprintf("lock is owned by another user (%s): only a repository admin may remove it, with --force", l.Owner))
			return
		}
	}
	if err := t.s.Index.DeleteLock(t.ctx, t.repo.Name, l.ID); err != nil {
		t.fail(http.StatusServiceUnavailable, "temporarily unavailable: the LFS index did not answer")
		return
	}
	t.status(http.StatusOK, lockArgs(l))
}

// listLocks answers list-lock (every lock) and list-locks (each marked
// ours or theirs, for verifying a push).
func (t *transferSession) listLocks(verify bool, args map[string]string) {
	limit, aerr := pageLimit(args["limit"])
	if aerr != nil {
		t.fail(aerr.Status, aerr.Message)
		return
	}
	f := LockFilter{Cursor: args["cursor"], Limit: limit + 1}
	if !verify {
		f.Path, f.ID = args["path"], args["id"]
	}
	ls, err := t.s.Index.Locks(t.ctx, t.repo.Name, f)
	if err != nil {
		t.fail(http.StatusServiceUnavailable, "temporarily unavailable: the LFS index did not answer")
		return
	}
	ls, next := page(ls, limit)
	pktline.Writef(t.out, "status 200\n")
	if next != "" {
		pktline.Writef(t.out, "next-cursor=%s\n", next)
	}
	t.out.WriteString("0001")
	for _, l := range ls {
		who := "theirs"
		if l.Owner == t.p.User {
			who = "ours"
		}
		pktline.Writef(t.out, "lock %s\n", l.ID)
		pktline.Writef(t.out, "path %s %s\n", l.ID, l.Path)
		pktline.Writef(t.out, "locked-at %s %s\n", l.ID, l.LockedAt.Format(time.RFC3339))
		pktline.Writef(t.out, "ownername %s %s\n", l.ID, l.Owner)
		pktline.Writef(t.out, "owner %s %s\n", l.ID, who)
	}
	pktline.WriteFlush(t.out)
}
