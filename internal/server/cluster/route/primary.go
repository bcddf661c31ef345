package route

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"packwire/internal/packidx"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"packwire/internal/access"
	"packwire/internal/gitexec"
	"packwire/internal/oid"
	"packwire/internal/repo"
	"packwire/internal/server/cluster"
)

// pendingPush is a push between its "prepared" call (its generation
// committed in PostgreSQL) and its "committed" one (git wrote the
// primary's refs).
type pendingPush struct {
	gen    int64
	digest string // the generation's refs' (cluster.RefDigest)
	since  time.Time
}

// pendingTTL drops a pending push whose receive-pack never came back (it
// was killed): its copy stays behind, and is caught up.
const pendingTTL = 10 * time.Minute

// maxHookRequest bounds one hook call's JSON: a push's update lines (at
// most the pipeline's bound on its commands, each two ids and a ref name)
// and git's quarantine variables.
const maxHookRequest = 64 << 20

// maxSocketPath is the longest unix socket path every platform takes.
const maxSocketPath = 100

// ServeHooks listens on a unix socket at path (its directory made 0700,
// the socket 0600) for the reference-transaction hooks of pushes on this
// node, until ctx ends. The hooks prove themselves with a random token
// the server gives them in their environment (Route). It returns once
// the socket is listening.
func (rt *Router) ServeHooks(ctx context.Context, path string) error {
	if len(path) > maxSocketPath {
		// Too long for a socket's address (a deep data directory): a
		// private directory of the machine's temporary one instead.
		dir, err := os.MkdirTemp("", "packwire-hooks-")
		if err != nil {
			return err
		}
		go func() { <-ctx.Done(); os.RemoveAll(dir) }()
		path = filepath.Join(dir, filepath.Base(path))
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	if err := os.Chmod(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	os.Remove(path) // a socket left by a killed server
	b := make([]byte, 32)
	rand.Read(b)
	token := hex.EncodeToString(b)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("cluster hook socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return err
	}
	rt.mu.Lock()
	rt.hookSocket, rt.hookToken = path, token
	rt.mu.Unlock()
	go func() { <-ctx.Done(); ln.Close() }()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
					return
				}
				time.Sleep(10 * time.Millisecond)
				continue
			}
			go rt.serveHook(ctx, conn)
		}
	}()
	return nil
}

// serveHook answers one hook call.
func (rt *Router) serveHook(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	// Bounded: a caller with the socket open but a request without end
	// must not grow the server's memory.
	dec := json.NewDecoder(io.LimitReader(conn, maxHookRequest))
	var req cluster.HookRequest
	if err := dec.Decode(&req); err != nil {
		return
	}
	conn.SetReadDeadline(time.Time{})
	answer := func(err error) {
		var a cluster.HookAnswer
		if err != nil {
			a.Error = err.Error()
		}
		json.NewEncoder(conn).Encode(a)
	}
	rt.mu.Lock()
	token := rt.hookToken
	rt.mu.Unlock()
	if token == "" || subtle.ConstantTimeCompare([]byte(req.Token), []byte(token)) != 1 {
		answer(errors.New("cluster: the hook's token is not this server's; nothing was written"))
		return
	}
	key := req.Repo + "\x00" + req.Txn
	rt.Node.Log.Debug("cluster: hook call", "repo", req.Repo, "state", req.State)
	switch req.State {
	case "prepared":
		// The hook gone (receive-pack killed with the client's request):
		// the push is given up on, unless already committed.
		// Shorter than the hook's own wait (ReplicateTimeout + 30 s), so
		// that the server, not the hook, decides near the bound.
		ctx, cancel := context.WithTimeout(ctx, cluster.ReplicateTimeout+15*time.Second)
		defer cancel()
		go func() {
			io.Copy(io.Discard, io.MultiReader(dec.Buffered(), conn))
			cancel()
		}()
		err := rt.replicate(ctx, req.Repo, key, req.Txn, req.Updates)
		rt.mu.Lock()
		after := rt.afterCommit
		rt.mu.Unlock()
		if err == nil && after != nil {
			after(req.Repo)
		}
		if req.Push != "" {
			rt.mu.Lock()
			rt.unlinkHook(req.Push, req.Repo, key, req.Updates)
			rt.mu.Unlock()
		}
		answer(err)
	case "committed":
		rt.mu.Lock()
		p, ok := rt.pending[key]
		delete(rt.pending, key)
		rt.mu.Unlock()
		if ok {
			rt.recordOwn(req.Repo, p)
		}
		answer(nil)
	default: // aborted
		rt.mu.Lock()
		delete(rt.pending, key)
		rt.mu.Unlock()
		answer(nil)
	}
}

// recordOwn records, in the background, that this primary's copy holds
// the push's generation, once git has written its refs (the hook's
// "committed" call, or receive-pack's exit): only then, and only if the
// digest of its refs read from disk is the generation's, so that a
// primary killed in between, or whose refs are not the push's (its
// commit failed), is stale, not falsely current, and is caught up. The
// next push to the repository waits for it (awaitOwn).
func (rt *Router) recordOwn(name string, p pendingPush) {
	done := make(chan struct{})
	rt.mu.Lock()
	if rt.recording == nil {
		rt.recording = map[string]chan struct{}{}
	}
	prev := rt.recording[name]
	rt.recording[name] = done
	rt.mu.Unlock()
	go func() {
		defer func() {
			rt.mu.Lock()
			if rt.recording[name] == done {
				delete(rt.recording, name)
			}
			rt.mu.Unlock()
			close(done)
		}()
		if prev != nil {
			<-prev
		}
		got, err := rt.copyDigest(name)
		if err != nil {
			rt.Node.Log.Warn("cluster: reading the primary's refs; its copy is caught up", "repo", name, "generation", p.gen, "error", err.Error())
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for {
			err := cluster.RecordCopy(ctx, rt.Node.DB, name, rt.Node.Name, p.gen, p.digest, got)
			if errors.Is(err, cluster.ErrNotTheRefs) {
				// receive-pack did not write the push's refs here (killed, or
				// its commit failed), or something else moved them: this copy
				// stays behind and catches up.
				rt.Node.Log.Warn("cluster: the primary's refs are not the push's generation's; its copy is caught up", "repo", name, "generation", p.gen)
				return
			}
			if err == nil {
				return
			}
			if ctx.Err() != nil {
				rt.Node.Log.Warn("cluster: recording the primary's copy", "repo", name, "generation", p.gen, "error", err.Error())
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
}

// copyDigest is the digest of this node's copy of name's refs.
func (rt *Router) copyDigest(name string) (string, error) {
	r, err := rt.Repos.Resolve(name)
	if err != nil {
		return "", err
	}
	return cluster.CopyDigest(r.Path)
}

// awaitOwn waits for the record of this primary's previous push to name.
func (rt *Router) awaitOwn(ctx context.Context, name string) {
	rt.mu.Lock()
	ch := rt.recording[name]
	rt.mu.Unlock()
	if ch != nil {
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}
}

// replicate is a push's "prepared" step on its primary: with the
// repository's push turn held (cluster.BeginPush), the push's new objects (the pack receive-pack
// kept, or one made here) are sent once made, after the updates, to every
// other up-to-date replica in parallel
// (ReplicatePath); as soon as a majority, this copy counted, holds the
// update, the next generation is committed with the voters' and the hook
// may let git commit. Replicas that answer later are recorded at the new
// generation when they do; a replica that fails is left stale and caught
// up by its node.
func (rt *Router) replicate(ctx context.Context, name, key, receivePack string, updates []cluster.Update) error {
	began := time.Now()
	var packed, majority time.Duration
	rt.awaitOwn(ctx, name)
	p, err := cluster.BeginPush(ctx, rt.Node.DB, name, rt.Node.Name, rt.Node.NodeTimeout())
	if err != nil {
		return err
	}
	committed := false
	defer func() {
		if !committed {
			p.Rollback()
		}
	}()
	// One pack of the new objects, the same bytes for every replica,
	// made while the replicas read the updates (and start their
	// transaction).
	rp, err := rt.Repos.Resolve(name)
	if err != nil {
		return err
	}
	// The generation this push makes is this copy's refs, found to be the
	// previous generation's, with the push's updates (git holds them
	// locked at their old values): its digest is what every voter's refs,
	// and later this copy's, must have.
	before, err := cluster.CopyRefs(rp.Path)
	if err != nil {
		return fmt.Errorf("cluster: reading this copy's refs: %w", err)
	}
	if p.Digest != "" && cluster.RefDigest(before) != p.Digest {
		// A replication this copy took as a replica, from a primary
		// failed over before it committed it, is undone: this push holds
		// the turn, so it never will be (undo.go). If it cannot be (the
		// push holds one of its refs locked), the copy is marked behind:
		// its catch-up undoes it. Both before the count of the replicas:
		// a copy behind can catch up from this one only once it is undone.
		if before, err = rt.undoOwn(ctx, rp, p.Digest); err != nil {
			return err
		}
	}
	if p.Digest != "" && cluster.RefDigest(before) != p.Digest {
		// Recorded at the generation without its refs (a replication not
		// undone yet, or changed behind packwire's back): marked behind,
		// it is caught up (or undone) before it takes a push again.
		p.MarkStale(ctx, []string{rt.Node.Name}) // written at once while the push holds its turn
		p.Rollback()
		return fmt.Errorf("cluster: this node's copy of %s does not hold generation %d's refs and is being caught up; nothing was written, push again shortly", name, p.Generation)
	}
	if len(p.Targets)+1 < p.Need() {
		return fmt.Errorf("cluster: only %d of %d replicas of %s can take the push (%d needed); nothing was written: %s",
			len(p.Targets)+1, p.Total, name, p.Need(), strings.Join(p.Skipped, "; "))
	}
	want := cluster.RefDigest(cluster.Apply(before, updates))
	pk := &packing{done: make(chan struct{})}
	if len(p.Targets) == 0 {
		close(pk.done)
	} else {
		go func() {
			defer close(pk.done)
			// The pack receive-pack kept (Route sets receive.unpackLimit=1),
			// as it is; one made for the replicas when there is none.
			if pk.pack, pk.err = keptPack(rp.Path, receivePack, updates); pk.pack == nil && pk.err == nil {
				pk.pack, pk.err = packFor(ctx, rp, updates)
			}
			packed = time.Since(began)
		}()
	}
	results := make(chan sendResult, len(p.Targets))
	var sends sync.WaitGroup
	sendCtx, stopSends := context.WithTimeout(context.WithoutCancel(ctx), cluster.ReplicateTimeout)
	for _, r := range p.Targets {
		sends.Add(1)
		go func() {
			defer sends.Done()
			digest, err := rt.sendTo(sendCtx, r.URL, name, p.Digest, updates, pk)
			results <- sendResult{r.Node, digest, err}
		}()
	}
	go func() {
		sends.Wait()
		stopSends()
		<-pk.done
		pk.pack.Close()
	}()
	// A push given up on (the hook gone) before its majority stops the
	// sends; the replicas that took it are set back.
	stop := context.AfterFunc(ctx, stopSends)
	defer stop()
	var voters, failures, conflicted []string
	pending := len(p.Targets)
	take := func(res sendResult) {
		switch {
		case res.err == nil && res.digest == want:
			voters = append(voters, res.node)
		case res.err == nil:
			// It took the push, but its refs are not the generation's: not
			// a voter, and marked behind, to be caught up.
			res.err = fmt.Errorf("%w: its refs after the push are not generation %d's", errConflict, p.Generation+1)
			fallthrough
		case errors.Is(res.err, errConflict):
			conflicted = append(conflicted, res.node)
			fallthrough
		default:
			failures = append(failures, fmt.Sprintf("%s: %v", res.node, res.err))
		}
	}
	for ; pending > 0 && len(voters)+1 < p.Need(); pending-- {
		take(<-results)
	}
	majority = time.Since(began)
	if len(p.Targets) > 0 {
		if <-pk.done; pk.err != nil {
			failures = append(failures, "packing the push: "+pk.err.Error())
		}
	}
	// A copy that refused the old values is not at this primary's state
	// (a push that failed after it took it, say): marked behind, its node
	// catches it up from here.
	if len(conflicted) > 0 {
		if err := p.MarkStale(ctx, conflicted); err != nil {
			rt.Node.Log.Warn("cluster: marking copies behind", "repo", name, "nodes", strings.Join(conflicted, ","), "error", err.Error())
		}
	}
	fail := func(err error) error {
		// Every copy that took the push is set back to the old values:
		// the push failed, and a copy left ahead of its generation would
		// refuse the next one.
		for ; pending > 0; pending-- {
			take(<-results)
		}
		if errors.Is(err, cluster.ErrCommitUnknown) {
			rt.Node.Log.Warn("cluster: a push's commit is unknown; the copies that took it are left to be caught up", "repo", name, "voters", strings.Join(voters, ","), "error", err.Error())
			return err
		}
		// Bounded and after the push's own context may have ended: a copy
		// that does not answer is marked behind rather than waited for.
		back, cancel := context.WithTimeout(context.WithoutCancel(ctx), cluster.ReplicateTimeout)
		defer cancel()
		var behind []string
		for _, v := range voters {
			if _, uerr := rt.sendTo(back, urlOf(p.Targets, v), name, want, reverse(updates), nil); uerr != nil {
				rt.Node.Log.Warn("cluster: setting back a copy after a failed push", "repo", name, "node", v, "error", uerr.Error())
				behind = append(behind, v)
			}
		}
		if len(behind) > 0 {
			if err := p.MarkStale(back, behind); err != nil {
				rt.Node.Log.Warn("cluster: marking copies behind", "repo", name, "nodes", strings.Join(behind, ","), "error", err.Error())
			}
		}
		return err
	}
	if len(voters)+1 < p.Need() {
		return fail(fmt.Errorf("cluster: only %d of %d replicas of %s took the push (%d needed); nothing was written: %s",
			len(voters)+1, p.Total, name, p.Need(), strings.Join(append(failures, p.Skipped...), "; ")))
	}
	if ctx.Err() != nil {
		return fail(ctx.Err())
	}
	rt.mu.Lock()
	die := rt.dieBeforeCommit
	rt.mu.Unlock()
	if die != nil && die(name) {
		for ; pending > 0; pending-- {
			take(<-results)
		}
		return errors.New("cluster: this node stopped before the push's commit (a test's)")
	}
	rt.mu.Lock()
	if rt.pending == nil {
		rt.pending = map[string]pendingPush{}
	}
	for k, v := range rt.pending {
		if time.Since(v.since) > pendingTTL {
			delete(rt.pending, k)
		}
	}
	rt.pending[key] = pendingPush{gen: p.Generation + 1, digest: want, since: time.Now()}
	rt.mu.Unlock()
	committed = true
	if err := p.Commit(ctx, voters, want); err != nil {
		rt.mu.Lock()
		delete(rt.pending, key)
		rt.mu.Unlock()
		return fail(err)
	}
	stop() // the push stands: the late replicas finish on their own
	<-pk.done
	rt.Node.Log.Debug("cluster: push replicated", "repo", name, "generation", p.Generation+1, "voters", strings.Join(voters, ","),
		"packed", packed, "majority", majority, "committed", time.Since(began))
	if pending > 0 {
		go rt.recordLate(name, p.Generation+1, want, results, pending)
	}
	return nil
}

// undoOwn is this primary's copy's refs (rp) after undoing its last
// replication if that takes them back to digest want (undoLastReplication;
// the caller holds the push turn); as they are otherwise.
func (rt *Router) undoOwn(ctx context.Context, rp repo.Repo, want string) (map[string]string, error) {
	writes, err := lockRefWrites(ctx, rp.Path)
	if err != nil {
		return nil, err
	}
	defer writes.Release()
	if _, err := undoLastReplication(ctx, rp.Path, want); err == nil {
		rt.Node.Log.Info("cluster: undid a replication its primary never committed", "repo", rp.Name)
	} else if !errors.Is(err, errNothingToUndo) {
		rt.Node.Log.Warn("cluster: undoing a replication its primary never committed", "repo", rp.Name, "error", err.Error())
	}
	refs, err := cluster.CopyRefs(rp.Path)
	if err != nil {
		return nil, fmt.Errorf("cluster: reading this copy's refs: %w", err)
	}
	return refs, nil
}

// reverse undoes updates: each ref back from its new value to its old.
func reverse(updates []cluster.Update) []cluster.Update {
	back := make([]cluster.Update, len(updates))
	for i, u := range updates {
		back[i] = cluster.Update{Old: u.New, New: u.Old, Ref: u.Ref}
	}
	return back
}

func urlOf(replicas []cluster.Replica, node string) string {
	for _, r := range replicas {
		if r.Node == node {
			return r.URL
		}
	}
	return ""
}

// sendResult is one replica's answer to a push.
type sendResult struct {
	node   string
	digest string // of the replica's refs once it took the push
	err    error
}

// recordLate records the n replicas still sending a push that was
// answered without them, each at the push's generation once it holds it
// (if its copy is still at the one before, and its refs have the
// generation's digest, want); one that failed stays stale and is caught
// up by its node.
func (rt *Router) recordLate(name string, gen int64, want string, results <-chan sendResult, n int) {
	for ; n > 0; n-- {
		res := <-results
		if res.err != nil {
			rt.Node.Log.Warn("cluster: a replica did not take a push (caught up later)", "repo", name, "node", res.node, "generation", gen, "error", res.err.Error())
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := cluster.RecordCopy(ctx, rt.Node.DB, name, res.node, gen, want, res.digest); err != nil {
			rt.Node.Log.Warn("cluster: recording a replica", "repo", name, "node", res.node, "generation", gen, "error", err.Error())
		}
		cancel()
	}
}

// packed is a pack and its index, made once for every replica: their
// files are unlinked, each sender reads them through its own sections.
type packed struct {
	name              string // the pack's id, as in pack-<name>.pack
	pack, idx         *os.File
	packSize, idxSize int64
}

func (p *packed) Close() {
	if p != nil {
		p.pack.Close()
		p.idx.Close()
	}
}

// keptPack is the pack receive-pack (process receivePack) stored for
// this push, with its index: index-pack keeps it ("receive-pack PID on
// HOST" in its .keep file) until the refs are updated, so it is there,
// whole (a thin pack's bases appended), while the hook runs. nil when
// there is none (a push without objects, or unpacked to loose objects).
//
// A .keep left by a receive-pack that was killed may name a pid the
// system has given again: a kept pack counts only if it holds one of the
// push's new values (the replica checks that the values are complete
// anyway).
func keptPack(gitDir, receivePack string, updates []cluster.Update) (*packed, error) {
	if receivePack == "" {
		return nil, nil
	}
	keeps, err := filepath.Glob(filepath.Join(gitDir, "objects", "pack", "pack-*.keep"))
	if err != nil {
		return nil, err
	}
	want := "receive-pack " + receivePack + " on "
	for _, keep := range keeps {
		b, err := os.ReadFile(keep)
		if err != nil || !strings.HasPrefix(string(b), want) {
			continue
		}
		base := strings.TrimSuffix(keep, ".keep")
		p := &packed{name: strings.TrimPrefix(filepath.Base(base), "pack-")}
		if !oid.Valid(p.name) {
			continue
		}
		if p.pack, p.packSize, err = openSized(base + ".pack"); err != nil {
			return nil, err
		}
		if p.idx, p.idxSize, err = openSized(base + ".idx"); err != nil {
			p.pack.Close()
			return nil, err
		}
		for _, u := range updates {
			if !cluster.IsZero(u.New) && packidx.Lookup(p.idx, p.idxSize, u.New) {
				return p, nil
			}
		}
		p.Close()
	}
	return nil, nil
}

// packFor packs the push's new objects once, for every replica: what the
// new values reach that neither the old values nor this copy's other refs
// do (the replicas are at the same state, so they hold those). The pack
// is whole (not thin) and comes with its index, so that a replica stores
// both as they are, after checking their checksums, instead of indexing
// the pack again. nil: no object to send.
func packFor(ctx context.Context, rp repo.Repo, updates []cluster.Update) (*packed, error) {
	var in strings.Builder
	for _, u := range updates {
		if !cluster.IsZero(u.New) {
			in.WriteString(u.New + "\n")
		}
	}
	if in.Len() == 0 {
		return nil, nil // deletes only
	}
	in.WriteString("--not\n")
	for _, u := range updates {
		if !cluster.IsZero(u.Old) {
			in.WriteString(u.Old + "\n")
		}
	}
	tips, err := refTips(rp.Path)
	if err != nil {
		return nil, err
	}
	for _, t := range tips {
		in.WriteString(t + "\n")
	}
	dir, err := os.MkdirTemp("", "packwire-replicate-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	cmd := exec.CommandContext(ctx, "git", "-c", "safe.directory=*", "-c", "pack.writeReverseIndex=false", "--git-dir", rp.Path,
		"pack-objects", "--revs", "--delta-base-offset", "-q", filepath.Join(dir, "pack"))
	cmd.Env = gitexec.Environ()
	cmd.Stdin = strings.NewReader(in.String())
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("pack-objects: %v: %s", err, cluster.LastLines(stderr.String(), 3))
	}
	p := &packed{name: strings.TrimSpace(stdout.String())}
	if !oid.Valid(p.name) {
		return nil, fmt.Errorf("pack-objects named its pack %q", p.name)
	}
	base := filepath.Join(dir, "pack-"+p.name)
	if p.pack, p.packSize, err = openSized(base + ".pack"); err != nil {
		return nil, err
	}
	if p.idx, p.idxSize, err = openSized(base + ".idx"); err != nil {
		p.pack.Close()
		return nil, err
	}
	// An empty pack (the new values were all here already) is not sent.
	var hdr [12]byte
	if _, err := p.pack.ReadAt(hdr[:], 0); err == nil && hdr[8]|hdr[9]|hdr[10]|hdr[11] == 0 {
		p.Close()
		return nil, nil
	}
	return p, nil
}

func openSized(path string) (*os.File, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, info.Size(), nil
}

// refTips are the object ids this copy's refs point at, outside the
// node's own namespace, read from the files (loose refs and packed-refs).
func refTips(gitDir string) ([]string, error) {
	seen := map[string]bool{}
	var tips []string
	add := func(id string) {
		if oid.Valid(id) && !seen[id] {
			seen[id] = true
			tips = append(tips, id)
		}
	}
	if f, err := os.Open(filepath.Join(gitDir, "packed-refs")); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			id, ref, ok := strings.Cut(sc.Text(), " ")
			if ok && !strings.HasPrefix(ref, cluster.LocalRefs) {
				add(id)
			}
		}
		f.Close()
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	root := filepath.Join(gitDir, "refs")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // a ref deleted while walking
		}
		rel, _ := filepath.Rel(gitDir, path)
		if d.IsDir() {
			if filepath.ToSlash(rel)+"/" == cluster.LocalRefs {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".lock") {
			return nil // git's lock of a ref being updated: the new value
		}
		if b, err := os.ReadFile(path); err == nil {
			add(strings.TrimSpace(string(b)))
		}
		return nil
	})
	return tips, err
}

// replicateClient carries replication to other nodes; its connections
// are kept between pushes.
var replicateClient = &http.Client{Transport: &http.Transport{
	DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	MaxIdleConnsPerHost: 16,
	IdleConnTimeout:     90 * time.Second,
	DisableCompression:  true,
}}

// packing is a pack being made for the replicas.
type packing struct {
	done chan struct{} // closed when pack and err are set
	pack *packed       // nil: no object to send
	err  error
}

// sendTo replicates one push to the node at nodeURL (ReplicatePath): the
// updates at once, then the pack and its index when pk has them (nil: no
// new objects). It returns the digest of the replica's refs once it took
// the push. before is the digest the replica's refs must have first (""
// when not known): a copy elsewhere refuses (409).
func (rt *Router) sendTo(ctx context.Context, nodeURL, name, before string, updates []cluster.Update, pk *packing) (string, error) {
	head := updateLines(updates)
	var body io.Reader = strings.NewReader(head)
	length := int64(len(head))
	if pk != nil {
		length = -1 // chunked: the pack follows when it is made
		body = io.MultiReader(body, &lazyReader{open: func() (io.Reader, error) {
			<-pk.done
			if pk.err != nil {
				return nil, pk.err
			}
			r, _ := packPart(pk.pack)
			return r, nil
		}})
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(nodeURL, "/")+ReplicatePath, body)
	if err != nil {
		return "", err
	}
	req.ContentLength = length
	req.Header.Set(hdrReplicaRepo, name)
	if before != "" {
		req.Header.Set(hdrReplicaBefore, before)
	}
	req.Header.Set("Content-Type", "application/x-packwire-replicate")
	req.SetBasicAuth(access.ClusterUser, rt.Secret)
	resp, err := replicateClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	switch resp.StatusCode {
	case http.StatusOK:
		// "ok <digest>"
		_, digest, _ := strings.Cut(strings.TrimSpace(string(msg)), " ")
		return digest, nil
	case http.StatusConflict:
		return "", fmt.Errorf("%w: %s", errConflict, strings.TrimSpace(string(msg)))
	}
	return "", fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(msg)))
}

// lazyReader reads what open gives, opened at the first read.
type lazyReader struct {
	open func() (io.Reader, error)
	r    io.Reader
}

func (l *lazyReader) Read(p []byte) (int, error) {
	if l.r == nil {
		r, err := l.open()
		if err != nil {
			return 0, err
		}
		l.r = r
	}
	return l.r.Read(p)
}

// updateLines are the updates as a replication's body starts (see
// ReplicatePath): a line each, then an empty line.
func updateLines(updates []cluster.Update) string {
	var head strings.Builder
	for _, u := range updates {
		fmt.Fprintf(&head, "%s %s %s\n", u.Old, u.New, u.Ref)
	}
	head.WriteString("\n")
	return head.String()
}

// packPart is the rest of the body: the pack's line, the pack and its
// index (nothing for nil), and its length.
func packPart(pack *packed) (io.Reader, int64) {
	if pack == nil {
		return strings.NewReader(""), 0
	}
	line := fmt.Sprintf("pack %s %d %d\n", pack.name, pack.packSize, pack.idxSize)
	return io.MultiReader(strings.NewReader(line), io.NewSectionReader(pack.pack, 0, pack.packSize), io.NewSectionReader(pack.idx, 0, pack.idxSize)),
		int64(len(line)) + pack.packSize + pack.idxSize
}

// wireBody is a whole replication's body and its length.
func wireBody(updates []cluster.Update, pack *packed) (io.Reader, int64) {
	head := updateLines(updates)
	rest, n := packPart(pack)
	return io.MultiReader(strings.NewReader(head), rest), int64(len(head)) + n
}

// errConflict: the replica is not at the push's old values.
var errConflict = errors.New("not at the primary's state")
