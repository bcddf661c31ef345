// Package sizer measures a Git repository the way git-sizer does: object
// counts and total sizes by type, the biggest objects, the depth of the
// history and of tag chains, the number of references, and the biggest
// checkout among the branch tips, each with a level of concern.
//
// It reads the repository only through git (cat-file, rev-list,
// for-each-ref, ls-tree), never parsing packs itself: counts and sizes
// cover every object stored (reachable or not, as on disk), history depth
// and parent counts cover the commits reachable from the refs.
package sizer

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"

	"packwire/internal/oid"
)

// Metric is one measured figure. Concern is the value divided by the
// figure's threshold (see thresholds): 1 is one star of concern in the
// table; above 30 the table shows "!!!...". Object and Name say which
// object holds a "biggest" figure, where known.
type Metric struct {
	Value   int64   `json:"value"`
	Concern float64 `json:"concern"`
	Object  string  `json:"object,omitempty"`
	Name    string  `json:"name,omitempty"`
}

// Report is what Measure finds. Its JSON field names are stable.
type Report struct {
	Repository string   `json:"repository"`
	Overall    Overall  `json:"overall"`
	Biggest    Biggest  `json:"biggest_objects"`
	History    History  `json:"history"`
	Checkout   Checkout `json:"biggest_checkout"`
}

// Overall is the size of the whole repository.
type Overall struct {
	CommitCount Metric `json:"commit_count"`
	CommitSize  Metric `json:"commit_total_size"`
	TreeCount   Metric `json:"tree_count"`
	TreeSize    Metric `json:"tree_total_size"`
	TreeEntries Metric `json:"tree_total_entries"`
	BlobCount   Metric `json:"blob_count"`
	BlobSize    Metric `json:"blob_total_size"`
	TagCount    Metric `json:"annotated_tag_count"`
	RefCount    Metric `json:"reference_count"`
	DiskSize    int64  `json:"disk_size"` // bytes the objects take on disk (packed or loose); not rated
	Branches    int    `json:"branches"`  // refs/heads/*
	Tags        int    `json:"tags"`      // refs/tags/*
}

// Biggest is the largest single objects.
type Biggest struct {
	CommitSize  Metric `json:"max_commit_size"`
	Parents     Metric `json:"max_parent_count"`
	TreeEntries Metric `json:"max_tree_entries"`
	BlobSize    Metric `json:"max_blob_size"`
}

// History is the shape of the commit graph and of tag chains.
type History struct {
	Depth    Metric `json:"max_history_depth"` // commits on the longest parent chain
	TagDepth Metric `json:"max_tag_depth"`     // tags to go through to reach a non-tag
}

// Checkout is the biggest checkout among HEAD and the branch tips, each
// figure maximised on its own (as git-sizer does).
type Checkout struct {
	Directories Metric `json:"directories"`     // trees, the root included
	PathDepth   Metric `json:"max_path_depth"`  // components of the longest path (a/b/c = 3)
	PathLength  Metric `json:"max_path_length"` // bytes of the longest path
	Files       Metric `json:"files"`           // regular files
	FileSize    Metric `json:"total_file_size"` // bytes of the regular files
	Symlinks    Metric `json:"symlinks"`
	Submodules  Metric `json:"submodules"`
}

// Thresholds: the value of each figure that earns one star of concern,
// git-sizer's own (sizes/output.go), chosen there from what makes Git
// slow or hosting painful: e.g. 500 k commits make history walks slow,
// 2,500 entries make a tree expensive to rewrite on every commit, a 10 MB
// blob is beyond what Git handles gracefully, 50 k files make checkouts
// and status slow, and any annotated tag chain (depth 1) earns a star.
var thresholds = struct {
	commitCount, commitSize, treeCount, treeSize, treeEntries, blobCount, blobSize, tagCount, refCount float64
	maxCommitSize, maxParents, maxTreeEntries, maxBlobSize, historyDepth, tagDepth                     float64
	directories, pathDepth, pathLength, files, fileSize, symlinks, submodules                          float64
}{
	commitCount: 500e3, commitSize: 250e6, treeCount: 1.5e6, treeSize: 2e9, treeEntries: 50e6,
	blobCount: 1.5e6, blobSize: 10e9, tagCount: 25e3, refCount: 25e3,
	maxCommitSize: 50e3, maxParents: 10, maxTreeEntries: 2.5e3, maxBlobSize: 10e6,
	historyDepth: 500e3, tagDepth: 1,
	directories: 2000, pathDepth: 10, pathLength: 100, files: 50e3, fileSize: 1e9, symlinks: 25e3, submodules: 100,
}

// Measure measures the repository at dir (bare or not).
func Measure(ctx context.Context, dir string) (*Report, error) {
	if _, err := exec.LookPath("git"); err != nil {
		return nil, errors.New("git is not installed (or not on the PATH)")
	}
	g := gitRunner{dir: dir, env: gitEnv()}
	if _, err := g.output(ctx, "rev-parse", "--git-dir"); err != nil {
		return nil, fmt.Errorf("%s is not a git repository", dir)
	}
	r := &Report{Repository: dir}
	objs, err := g.scanObjects(ctx)
	if err != nil {
		return nil, err
	}
	o := &r.Overall
	o.CommitCount.Value, o.CommitSize.Value = objs.commits, objs.commitSize
	o.TreeCount.Value, o.TreeSize.Value, o.TreeEntries.Value = objs.trees, objs.treeSize, objs.treeEntries
	o.BlobCount.Value, o.BlobSize.Value = objs.blobs, objs.blobSize
	o.TagCount.Value = int64(len(objs.tags))
	o.DiskSize = objs.disk
	r.Biggest.CommitSize = objs.maxCommit
	r.Biggest.TreeEntries = objs.maxTreeEntries
	r.Biggest.BlobSize = objs.maxBlob

	refs, err := g.refs(ctx)
	if err != nil {
		return nil, err
	}
	o.RefCount.Value = int64(len(refs))
	for _, ref := range refs {
		switch {
		case strings.HasPrefix(ref.name, "refs/heads/"):
			o.Branches++
		case strings.HasPrefix(ref.name, "refs/tags/"):
			o.Tags++
		}
	}
	if r.History.TagDepth, err = g.tagDepth(ctx, objs.tags, refs); err != nil {
		return nil, err
	}
	if r.History.Depth, r.Biggest.Parents, err = g.history(ctx); err != nil {
		return nil, err
	}
	if r.Checkout, err = g.checkouts(ctx, refs, &r.Biggest); err != nil {
		return nil, err
	}
	r.rate()
	return r, nil
}

// rate sets each metric's level of concern.
func (r *Report) rate() {
	t := thresholds
	for _, m := range []struct {
		m     *Metric
		scale float64
	}{
		{&r.Overall.CommitCount, t.commitCount}, {&r.Overall.CommitSize, t.commitSize},
		{&r.Overall.TreeCount, t.treeCount}, {&r.Overall.TreeSize, t.treeSize}, {&r.Overall.TreeEntries, t.treeEntries},
		{&r.Overall.BlobCount, t.blobCount}, {&r.Overall.BlobSize, t.blobSize},
		{&r.Overall.TagCount, t.tagCount}, {&r.Overall.RefCount, t.refCount},
		{&r.Biggest.CommitSize, t.maxCommitSize}, {&r.Biggest.Parents, t.maxParents},
		{&r.Biggest.TreeEntries, t.maxTreeEntries}, {&r.Biggest.BlobSize, t.maxBlobSize},
		{&r.History.Depth, t.historyDepth}, {&r.History.TagDepth, t.tagDepth},
		{&r.Checkout.Directories, t.directories}, {&r.Checkout.PathDepth, t.pathDepth},
		{&r.Checkout.PathLength, t.pathLength}, {&r.Checkout.Files, t.files}, {&r.Checkout.FileSize, t.fileSize},
		{&r.Checkout.Symlinks, t.symlinks}, {&r.Checkout.Submodules, t.submodules},
	} {
		m.m.Concern = float64(m.m.Value) / m.scale
	}
}

type gitRunner struct {
	dir string
	env []string
}

// gitEnv is the caller's environment without variables that would point
// git at another repository than the one asked for.
func gitEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES",
			"GIT_COMMON_DIR", "GIT_NAMESPACE", "GIT_QUARANTINE_PATH":
			continue
		}
		env = append(env, kv)
	}
	return env
}

func (g gitRunner) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "git", append([]string{"-C", g.dir}, args...)...)
	cmd.Env = g.env
	return cmd
}

func (g gitRunner) output(ctx context.Context, args ...string) (string, error) {
	cmd := g.command(ctx, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// stream runs git and hands its output to read, which must consume all
// of it.
func (g gitRunner) stream(ctx context.Context, stdin io.Reader, read func(io.Reader) error, args ...string) error {
	cmd := g.command(ctx, args...)
	cmd.Stdin = stdin
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("git %s: %w", args[0], err)
	}
	readErr := read(bufio.NewReaderSize(out, 1<<16))
	if readErr != nil {
		io.Copy(io.Discard, out)
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	if readErr != nil {
		return fmt.Errorf("reading git %s: %w", args[0], readErr)
	}
	return nil
}

type objectScan struct {
	commits, commitSize, trees, treeSize, treeEntries, blobs, blobSize, disk int64
	maxCommit, maxTreeEntries, maxBlob                                       Metric
	tags                                                                     []string
}

// scanObjects lists every object with its type and sizes, and counts tree
// entries by reading the trees through a second cat-file as they are
// listed.
func (g gitRunner) scanObjects(ctx context.Context) (*objectScan, error) {
	s := &objectScan{}
	// Trees go to a cat-file --batch that reads them while the listing
	// goes on; its output is parsed in another goroutine.
	treesIn, treesInW := io.Pipe()
	treeWriter := bufio.NewWriterSize(treesInW, 1<<16)
	var treeErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		treeErr = g.stream(ctx, treesIn, func(r io.Reader) error {
			return readBatch(r.(*bufio.Reader), func(oid, typ string, body []byte) error {
				n, err := countTreeEntries(body, len(oid)/2)
				if err != nil {
					return fmt.Errorf("tree %s: %w", oid, err)
				}
				s.treeEntries += int64(n)
				if int64(n) > s.maxTreeEntries.Value {
					s.maxTreeEntries = Metric{Value: int64(n), Object: oid}
				}
				return nil
			})
		}, "cat-file", "--batch")
		treesIn.CloseWithError(treeErr) // unblocks the listing if cat-file failed
	}()
	listErr := g.stream(ctx, nil, func(r io.Reader) error {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			oid, typ, size, disk, err := parseCheckLine(sc.Text())
			if err != nil {
				return err
			}
			s.disk += disk
			switch typ {
			case "commit":
				s.commits++
				s.commitSize += size
				if size > s.maxCommit.Value {
					s.maxCommit = Metric{Value: size, Object: oid}
				}
			case "tree":
				s.trees++
				s.treeSize += size
				if _, err := fmt.Fprintln(treeWriter, oid); err != nil {
					return err
				}
			case "blob":
				s.blobs++
				s.blobSize += size
				if size > s.maxBlob.Value {
					s.maxBlob = Metric{Value: size, Object: oid}
				}
			case "tag":
				s.tags = append(s.tags, oid)
			}
		}
		return sc.Err()
	}, "cat-file", "--batch-all-objects", "--unordered", "--batch-check=%(objectname) %(objecttype) %(objectsize) %(objectsize:disk)")
	flushErr := treeWriter.Flush()
	treesInW.Close()
	wg.Wait()
	switch {
	case listErr != nil:
		return nil, listErr
	case treeErr != nil:
		return nil, treeErr
	case flushErr != nil:
		return nil, flushErr
	}
	return s, nil
}

// parseCheckLine parses "<oid> <type> <size> <disk size>".
func parseCheckLine(line string) (id, typ string, size, disk int64, err error) {
	f := strings.Fields(line)
	if len(f) != 4 || !oid.Valid(f[0]) {
		return "", "", 0, 0, fmt.Errorf("unexpected line from cat-file: %q", line)
	}
	size, err1 := strconv.ParseInt(f[2], 10, 64)
	disk, err2 := strconv.ParseInt(f[3], 10, 64)
	if err1 != nil || err2 != nil || size < 0 || disk < 0 {
		return "", "", 0, 0, fmt.Errorf("unexpected sizes from cat-file: %q", line)
	}
	return f[0], f[1], size, disk, nil
}

// readBatch reads cat-file --batch output: "<oid> <type> <size>\n",
// the object, "\n"; for each object.
func readBatch(r *bufio.Reader, each func(oid, typ string, body []byte) error) error {
	var body bytes.Buffer
	for {
		header, err := r.ReadString('\n')
		if err == io.EOF && header == "" {
			return nil
		}
		if err != nil {
			return err
		}
		f := strings.Fields(header)
		if len(f) == 2 && f[1] == "missing" {
			return fmt.Errorf("object %s is missing", f[0])
		}
		if len(f) != 3 {
			return fmt.Errorf("unexpected header from cat-file: %q", header)
		}
		size, err := strconv.Atoi(f[2])
		if err != nil || size < 0 {
			return fmt.Errorf("unexpected header from cat-file: %q", header)
		}
		// The buffer grows as the object arrives: a wrong size in a header
		// cannot make it allocate more than what follows.
		body.Reset()
		if n, err := body.ReadFrom(io.LimitReader(r, int64(size)+1)); err != nil {
			return err
		} else if n != int64(size)+1 {
			return io.ErrUnexpectedEOF
		}
		if err := each(f[0], f[1], body.Bytes()[:size]); err != nil {
			return err
		}
	}
}

// countTreeEntries counts the entries of a raw tree object: "<mode> <name>\0"
// followed by a binary object id of hashLen bytes, for each entry.
func countTreeEntries(tree []byte, hashLen int) (int, error) {
	n := 0
	for len(tree) > 0 {
		sp := bytes.IndexByte(tree, ' ')
		if sp <= 0 {
			return n, errors.New("malformed tree: no mode")
		}
		for _, c := range tree[:sp] {
			if c < '0' || c > '7' {
				return n, errors.New("malformed tree: bad mode")
			}
		}
		nul := bytes.IndexByte(tree[sp:], 0)
		if nul <= 1 {
			return n, errors.New("malformed tree: no name")
		}
		end := sp + nul + 1 + hashLen
		if end > len(tree) {
			return n, errors.New("malformed tree: truncated object id")
		}
		tree = tree[end:]
		n++
	}
	return n, nil
}

type ref struct{ name, oid, typ, tree string }

func (g gitRunner) refs(ctx context.Context) ([]ref, error) {
	out, err := g.output(ctx, "for-each-ref", "--format=%(objectname) %(objecttype) %(tree) %(refname)")
	if err != nil {
		return nil, err
	}
	var refs []ref
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if line == "" {
			continue
		}
		f := strings.SplitN(line, " ", 4)
		if len(f) != 4 {
			return nil, fmt.Errorf("unexpected line from for-each-ref: %q", line)
		}
		refs = append(refs, ref{oid: f[0], typ: f[1], tree: f[2], name: f[3]})
	}
	return refs, nil
}

// tagDepth follows every annotated tag to the first object that is not a
// tag; the longest chain is the depth (1 for a plain annotated tag).
func (g gitRunner) tagDepth(ctx context.Context, tags []string, refs []ref) (Metric, error) {
	if len(tags) == 0 {
		return Metric{}, nil
	}
	target := map[string]string{} // tag -> the tag it points to, "" if a non-tag
	in := strings.NewReader(strings.Join(tags, "\n") + "\n")
	err := g.stream(ctx, in, func(r io.Reader) error {
		return readBatch(r.(*bufio.Reader), func(oid, typ string, body []byte) error {
			obj, objType, err := parseTagHeader(body)
			if err != nil {
				return fmt.Errorf("tag %s: %w", oid, err)
			}
			target[oid] = ""
			if objType == "tag" {
				target[oid] = obj
			}
			return nil
		})
	}, "cat-file", "--batch")
	if err != nil {
		return Metric{}, err
	}
	depth := map[string]int64{}
	var walk func(oid string, seen int) int64
	walk = func(oid string, seen int) int64 {
		if d, ok := depth[oid]; ok {
			return d
		}
		next, ok := target[oid]
		if !ok || seen > len(target) { // not a tag we know (or a cycle, which git cannot make)
			return 0
		}
		d := int64(1)
		if next != "" {
			d += walk(next, seen+1)
		}
		depth[oid] = d
		return d
	}
	var m Metric
	for _, t := range tags {
		if d := walk(t, 0); d > m.Value {
			m = Metric{Value: d, Object: t}
		}
	}
	for _, r := range refs {
		if r.oid == m.Object {
			m.Name = r.name
			break
		}
	}
	return m, nil
}

// parseTagHeader returns the object a tag points to and its type.
func parseTagHeader(body []byte) (obj, typ string, err error) {
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" {
			break
		}
		if v, ok := strings.CutPrefix(line, "object "); ok {
			obj = v
		} else if v, ok := strings.CutPrefix(line, "type "); ok {
			typ = v
		}
	}
	if obj == "" || typ == "" {
		return "", "", errors.New("no object or type line")
	}
	return obj, typ, nil
}

// history returns the longest parent chain and the commit with the most
// parents among the commits reachable from the refs.
func (g gitRunner) history(ctx context.Context) (depth, parents Metric, err error) {
	depths := map[string]int32{}
	err = g.stream(ctx, nil, func(r io.Reader) error {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<16), 1<<24) // octopus merges make long lines
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 0 || !oid.Valid(f[0]) {
				return fmt.Errorf("unexpected line from rev-list: %q", sc.Text())
			}
			d := int32(0)
			for _, p := range f[1:] {
				d = max(d, depths[p]) // a parent not listed (shallow) counts 0
			}
			depths[f[0]] = d + 1
			if int64(d+1) > depth.Value {
				depth = Metric{Value: int64(d + 1), Object: f[0]}
			}
			if n := int64(len(f) - 1); n > parents.Value {
				parents = Metric{Value: n, Object: f[0]}
			}
		}
		return sc.Err()
	}, "rev-list", "--all", "--topo-order", "--reverse", "--parents")
	return depth, parents, err
}

// checkouts measures the checkout of HEAD and of every branch tip (each
// distinct tree once) and keeps the largest figures, each with the tree
// it comes from. On the way it names the biggest blob and the biggest
// tree in b when they are part of one of these checkouts.
func (g gitRunner) checkouts(ctx context.Context, refs []ref, b *Biggest) (Checkout, error) {
	type tip struct{ name, tree string }
	var tips []tip
	if out, err := g.output(ctx, "rev-parse", "--verify", "--quiet", "HEAD^{tree}"); err == nil {
		tips = append(tips, tip{"HEAD", strings.TrimSpace(out)})
	}
	for _, r := range refs {
		if strings.HasPrefix(r.name, "refs/heads/") && r.typ == "commit" && r.tree != "" {
			tips = append(tips, tip{r.name, r.tree})
		}
	}
	var c Checkout
	done := map[string]bool{}
	for _, t := range tips {
		if done[t.tree] {
			continue
		}
		done[t.tree] = true
		if b.TreeEntries.Object == t.tree && b.TreeEntries.Name == "" {
			b.TreeEntries.Name = t.name + "^{tree}"
		}
		var s checkoutSize
		s.dirs = 1
		err := g.stream(ctx, nil, func(r io.Reader) error {
			br := r.(*bufio.Reader)
			for {
				rec, err := br.ReadBytes(0)
				if err == io.EOF && len(rec) == 0 {
					return nil
				}
				if err != nil {
					return err
				}
				e, err := parseLsTree(rec[:len(rec)-1])
				if err != nil {
					return err
				}
				s.add(e)
				if e.oid == b.BlobSize.Object && b.BlobSize.Name == "" {
					b.BlobSize.Name = t.name + ":" + e.path
				}
				if e.oid == b.TreeEntries.Object && b.TreeEntries.Name == "" {
					b.TreeEntries.Name = t.name + ":" + e.path
				}
			}
		}, "ls-tree", "-r", "-t", "-l", "-z", "--full-tree", t.tree)
		if err != nil {
			return c, err
		}
		name := t.name + "^{tree}"
		for _, f := range []struct {
			m *Metric
			v int64
		}{
			{&c.Directories, s.dirs}, {&c.PathDepth, s.depth}, {&c.PathLength, s.length}, {&c.Files, s.files},
			{&c.FileSize, s.size}, {&c.Symlinks, s.links}, {&c.Submodules, s.submodules},
		} {
			if f.v > f.m.Value || f.m.Object == "" {
				*f.m = Metric{Value: f.v, Object: t.tree, Name: name}
			}
		}
	}
	return c, nil
}

type checkoutSize struct{ dirs, depth, length, files, size, links, submodules int64 }

func (s *checkoutSize) add(e lsTreeEntry) {
	s.depth = max(s.depth, int64(strings.Count(e.path, "/")+1))
	s.length = max(s.length, int64(len(e.path)))
	switch {
	case e.typ == "tree":
		s.dirs++
	case e.typ == "commit":
		s.submodules++
	case e.mode == "120000":
		s.links++
	default:
		s.files++
		s.size += e.size
	}
}

type lsTreeEntry struct {
	mode, typ, oid, path string
	size                 int64
}

// parseLsTree parses one record of ls-tree -l -z:
// "<mode> SP <type> SP <oid> SP+ <size or -> TAB <path>".
func parseLsTree(rec []byte) (lsTreeEntry, error) {
	meta, path, ok := bytes.Cut(rec, []byte{'\t'})
	f := strings.Fields(string(meta))
	if !ok || len(f) != 4 || len(path) == 0 || !oid.Valid(f[2]) {
		return lsTreeEntry{}, fmt.Errorf("unexpected record from ls-tree: %q", rec)
	}
	e := lsTreeEntry{mode: f[0], typ: f[1], oid: f[2], path: string(path)}
	if f[3] != "-" {
		size, err := strconv.ParseInt(f[3], 10, 64)
		if err != nil || size < 0 {
			return lsTreeEntry{}, fmt.Errorf("unexpected size from ls-tree: %q", rec)
		}
		e.size = size
	}
	return e, nil
}
