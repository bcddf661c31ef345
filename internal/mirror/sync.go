package mirror

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"packwire/internal/governor"
	"packwire/internal/outbox"
	"packwire/internal/repo"
	"packwire/internal/repolock"
)

// Kinds of the governor records mirrors leave.
const (
	KindSync = "mirror-sync" // a pull mirror fetched from upstream
	KindPush = "mirror-push" // a push mirror was pushed to
	// Transport of those records and of the events a sync publishes.
	Transport = "mirror"
)

// ErrNotMirror is returned by Sync for a repository that is no pull mirror.
var ErrNotMirror = errors.New("not a pull mirror")

// ErrElsewhere is Transaction's answer on a cluster node that is not the
// repository's primary: the primary syncs it.
var ErrElsewhere = errors.New("synced by the repository's primary, another node")

// Syncer brings pull mirrors up to date with their upstream.
type Syncer struct {
	// Record, if set, gets one governor record per sync (kind mirror-sync).
	Record func(governor.Record)
	// Publish, if set, hears of the refs a sync changed (webhooks, push
	// mirrors of the mirror).
	Publish func(context.Context, outbox.Event) error
	Log     *slog.Logger
	// Transaction, if set, is asked before a sync fetches anything: the
	// git config ("key=value") and environment its ref transaction runs
	// with (on a cluster's primary: replicated before git commits it), or
	// ErrElsewhere, when another node syncs the repository (nothing is
	// done or recorded), or another error (the sync fails).
	Transaction func(ctx context.Context, r repo.Repo) (config, env []string, err error)
}

// SyncResult is what one sync did and cost.
type SyncResult struct {
	Start           time.Time
	Wall            time.Duration
	UserCPU, SysCPU time.Duration      // every git the sync ran, with their children
	Bytes           int64              // what the fetch brought (its pack)
	Changed         []outbox.RefUpdate // the refs the sync wrote, by name
}

func (s *Syncer) log() *slog.Logger {
	if s.Log == nil {
		return slog.Default()
	}
	return s.Log
}

// Sync fetches everything upstream has into a quarantine, moves the new
// objects into the repository, then sets every ref to upstream's (created,
// updated, deleted: a fetch with prune) in one `git update-ref --stdin`
// transaction, so clients never see some refs of the new state and not
// the others after a failure. reason says why (interval, on demand).
func (s *Syncer) Sync(ctx context.Context, r repo.Repo, reason string) (SyncResult, error) {
	res := SyncResult{Start: time.Now()}
	cfg, err := ReadConfig(r)
	if err != nil {
		return res, err
	}
	if !cfg.IsPullMirror() {
		return res, fmt.Errorf("%s: %w", r.Name, ErrNotMirror)
	}
	// One sync of a repository at a time, in this process or another (the
	// scheduler's and `repo sync`): two would read the same refs and the
	// second's transaction would fail on the first's. The second waits,
	// then finds what upstream has beyond the first.
	lock, err := repolock.Serial(ctx, r.Path, syncLockFile)
	if err != nil {
		return res, fmt.Errorf("%s: waiting for the sync under way: %w", r.Name, err)
	}
	defer lock.Release()
	res.Start = time.Now()
	var txn refTransaction
	if s.Transaction != nil {
		// First: on a cluster's primary it also applies the repository's
		// settings, upstream's URL and credentials among them.
		if txn.config, txn.env, err = s.Transaction(ctx, r); errors.Is(err, ErrElsewhere) {
			return res, err
		}
		if err == nil {
			cfg, err = ReadConfig(r)
		}
		if err == nil && !cfg.IsPullMirror() {
			return res, fmt.Errorf("%s: %w", r.Name, ErrNotMirror)
		}
	}
	var creds Credentials
	if err == nil {
		creds, err = credentialsOf(r, cfg.PullRemote)
	}
	var c cost
	if err == nil {
		err = s.sync(ctx, r, cfg, creds, txn, &res, &c)
	}
	res.Wall = time.Since(res.Start)
	res.UserCPU, res.SysCPU = c.userCPU, c.sysCPU
	if err != nil && ctx.Err() == nil {
		err = errors.New(scrub(err.Error(), creds))
	}
	s.finish(ctx, r, cfg, res, err, reason)
	return res, err
}

// refTransaction is how a sync's ref transaction runs (Syncer.Transaction).
type refTransaction struct {
	config, env []string
}

func (s *Syncer) sync(ctx context.Context, r repo.Repo, cfg Config, creds Credentials, txn refTransaction, res *SyncResult, c *cost) error {
	removeStaleScratch(r.Path)
	// The quarantine: a scratch repository inside the served one (a name
	// starting with '.': never served, left out of backups) whose objects
	// directory receives the fetch, with the served objects as alternates
	// so that the fetch negotiates from everything the mirror has.
	scratch, err := os.MkdirTemp(r.Path, scratchPrefix)
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	run, err := git(ctx, "", nil, "init", "--bare", "-q", scratch)
	c.add(run)
	if err != nil {
		return err
	}
	alternates := filepath.Join(scratch, "objects", "info", "alternates")
	if err := os.WriteFile(alternates, []byte(filepath.Join(r.Path, "objects")+"\n"), 0o644); err != nil {
		return err
	}
	auth, env := gitAuth(cfg.PullURL, creds)
	args := append(auth, "--git-dir="+scratch, "fetch", "--quiet", "--no-tags", "--no-write-fetch-head",
		"--", cfg.PullURL, "+refs/*:refs/*", "^"+hiddenRefs+"*")
	run, err = git(ctx, "", env, args...)
	c.add(run)
	if err != nil {
		return err
	}
	if res.Bytes, err = objectBytes(filepath.Join(scratch, "objects")); err != nil {
		return err
	}
	if err := migrateObjects(filepath.Join(scratch, "objects"), filepath.Join(r.Path, "objects")); err != nil {
		return fmt.Errorf("moving the fetched objects into place: %w", err)
	}
	upstream, err := readRefs(ctx, scratch, c)
	if err != nil {
		return err
	}
	served, err := readRefs(ctx, r.Path, c)
	if err != nil {
		return err
	}
	changes := refChanges(served, upstream)
	if len(changes) == 0 {
		return nil
	}
	// One transaction: every ref is locked and checked against the value
	// read above (a concurrent sync makes this one fail whole), then all
	// are written.
	var in strings.Builder
	for _, u := range changes {
		switch {
		case u.Deleted():
			fmt.Fprintf(&in, "delete %s %s\n", u.Ref, u.Old)
		case u.Created():
			fmt.Fprintf(&in, "create %s %s\n", u.Ref, u.New)
		default:
			fmt.Fprintf(&in, "update %s %s %s\n", u.Ref, u.New, u.Old)
		}
	}
	var update []string
	for _, kv := range txn.config {
		update = append(update, "-c", kv)
	}
	update = append(update, "--git-dir="+r.Path, "update-ref", "--stdin")
	run, err = gitIn(ctx, "", txn.env, strings.NewReader(in.String()), update...)
	c.add(run)
	if err != nil {
		return err
	}
	res.Changed = changes
	return nil
}

// finish records, logs and publishes a sync, and keeps its state in the
// repository for the scheduler and repo mirror list.
func (s *Syncer) finish(ctx context.Context, r repo.Repo, cfg Config, res SyncResult, err error, reason string) {
	result := governor.ResultOK
	switch {
	case err != nil && ctx.Err() != nil:
		result = governor.ResultKilled
	case err != nil:
		result = governor.ResultGitError
	}
	if s.Record != nil {
		rec := governor.Record{ID: governor.NewID(res.Start), Start: res.Start, Transport: Transport, Repo: r.Name,
			Remote: Redact(cfg.PullURL), Service: "git-fetch", Kind: KindSync, PushedRefs: len(res.Changed), BytesIn: res.Bytes,
			Wall: governor.Duration(res.Wall), UserCPU: governor.Duration(res.UserCPU), SysCPU: governor.Duration(res.SysCPU), Result: result}
		if err != nil {
			rec.Error = err.Error()
		}
		s.Record(rec)
	}
	attrs := []any{"repo", r.Name, "upstream", Redact(cfg.PullURL), "reason", reason, "result", result, "bytes", res.Bytes,
		"refs_changed", len(res.Changed), "wall_ms", res.Wall.Milliseconds(), "cpu_ms", (res.UserCPU + res.SysCPU).Milliseconds()}
	if err != nil {
		s.log().Warn("mirror: sync failed", append(attrs, "error", err.Error())...)
	} else {
		s.log().Info("mirror: synced", attrs...)
	}
	prev, _ := ReadState(r)
	st := State{LastSync: res.Start, LastSuccess: prev.LastSuccess, Result: result, Bytes: res.Bytes, RefsChanged: len(res.Changed)}
	if err != nil {
		st.Error = err.Error()
	} else {
		st.LastSuccess = res.Start
	}
	if werr := writeState(r, st); werr != nil {
		s.log().Warn("mirror: state not saved", "repo", r.Name, "error", werr.Error())
	}
	if err == nil && len(res.Changed) > 0 && s.Publish != nil {
		ev := outbox.Event{Type: outbox.RefsChanged, Repo: r.Name, Transport: Transport, Time: time.Now(), Refs: res.Changed}
		if perr := s.Publish(context.WithoutCancel(ctx), ev); perr != nil {
			outbox.LogPublishError(s.log(), ev, perr)
		}
	}
}

// hiddenRefs are packwire's own refs, never mirrored either way.
const hiddenRefs = "refs/packwire/"

// readRefs lists a repository's refs but packwire's hidden ones.
func readRefs(ctx context.Context, gitDir string, c *cost) (map[string]string, error) {
	run, err := git(ctx, "", nil, "--git-dir="+gitDir, "for-each-ref", "--format=%(objectname) %(refname)")
	c.add(run)
	if err != nil {
		return nil, err
	}
	refs := map[string]string{}
	for _, line := range strings.Split(run.stdout, "\n") {
		id, ref, ok := strings.Cut(line, " ")
		if ok && !strings.HasPrefix(ref, hiddenRefs) {
			refs[ref] = id
		}
	}
	return refs, nil
}

// refChanges are the updates that make served equal to upstream, by ref name.
func refChanges(served, upstream map[string]string) []outbox.RefUpdate {
	var out []outbox.RefUpdate
	for ref, id := range upstream {
		if old, ok := served[ref]; !ok {
			out = append(out, outbox.RefUpdate{Ref: ref, Old: strings.Repeat("0", len(id)), New: id})
		} else if old != id {
			out = append(out, outbox.RefUpdate{Ref: ref, Old: old, New: id})
		}
	}
	for ref, id := range served {
		if _, ok := upstream[ref]; !ok {
			out = append(out, outbox.RefUpdate{Ref: ref, Old: id, New: strings.Repeat("0", len(id))})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Ref < out[j].Ref })
	return out
}

// objectBytes is the size of an objects directory's files (not info/).
func objectBytes(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "info" {
			return filepath.SkipDir
		}
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				total += fi.Size()
			}
		}
		return nil
	})
	return total, err
}

// migrateObjects moves a quarantine's objects into the repository, as
// receive-pack moves a push's: packs with their companions first and the
// .idx last (readers find a pack by its index), loose objects by rename.
// An object or pack already there is the same content under the same name.
func migrateObjects(from, to string) error {
	packs := filepath.Join(from, "pack")
	entries, err := os.ReadDir(packs)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	var indexes []string
	for _, e := range entries {
		name := e.Name()
		switch {
		case !e.Type().IsRegular() || strings.HasSuffix(name, ".keep") || strings.HasPrefix(name, "tmp_"):
		case strings.HasSuffix(name, ".idx"):
			indexes = append(indexes, name)
		default:
			if err := moveFile(filepath.Join(packs, name), filepath.Join(to, "pack", name)); err != nil {
				return err
			}
		}
	}
	for _, name := range indexes {
		if err := moveFile(filepath.Join(packs, name), filepath.Join(to, "pack", name)); err != nil {
			return err
		}
	}
	dirs, err := os.ReadDir(from)
	if err != nil {
		return err
	}
	for _, d := range dirs {
		if !d.IsDir() || len(d.Name()) != 2 {
			continue
		}
		files, err := os.ReadDir(filepath.Join(from, d.Name()))
		if err != nil {
			return err
		}
		for _, f := range files {
			if err := os.MkdirAll(filepath.Join(to, d.Name()), 0o755); err != nil {
				return err
			}
			if err := moveFile(filepath.Join(from, d.Name(), f.Name()), filepath.Join(to, d.Name(), f.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

func moveFile(from, to string) error {
	if _, err := os.Lstat(to); err == nil {
		return os.Remove(from)
	}
	return os.Rename(from, to)
}

// scratchPrefix names sync quarantines inside a mirror.
const scratchPrefix = ".packwire-mirror-"

// removeStaleScratch removes quarantines a killed sync left (an hour old:
// a sync of the same mirror from the command line may be running).
func removeStaleScratch(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), scratchPrefix) {
			continue
		}
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > time.Hour {
			os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
}

// State is a pull mirror's last sync, kept in the repository
// (packwire-mirror.json): the scheduler reads when it is due from it,
// across restarts, and repo mirror list shows it.
type State struct {
	LastSync    time.Time `json:"last_sync"` // start of the last sync, successful or not
	LastSuccess time.Time `json:"last_success"`
	Result      string    `json:"result"`
	Error       string    `json:"error,omitempty"`
	Bytes       int64     `json:"bytes"`
	RefsChanged int       `json:"refs_changed"`
}

const stateFile = "packwire-mirror.json"

// syncLockFile is held (repolock.Serial) while a sync runs.
const syncLockFile = "packwire-mirror-sync.lock"

// ReadState reads a pull mirror's last sync (zero: never synced).
func ReadState(r repo.Repo) (State, error) {
	var st State
	b, err := os.ReadFile(filepath.Join(r.Path, stateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(b, &st)
}

func writeState(r repo.Repo, st State) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(r.Path, "."+stateFile+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(r.Path, stateFile))
}
