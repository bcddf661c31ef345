package lfs

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"packwire/internal/oid"
)

// The push check (--lfs-require-objects): receive-pack's pre-receive hook,
// this binary in hook mode, refuses a push whose new blobs include an LFS
// pointer to an object the repository does not hold, naming the first.
// It runs once the pack is in the quarantine and before any ref moves.

// Hook environment: where the LFS store is and which repository is pushed.
const (
	EnvHookDir  = "PACKWIRE_LFS_DIR"
	EnvHookRepo = "PACKWIRE_LFS_REPO"
	// EnvHookIndexOnly: the store is not the disk under EnvHookDir; the
	// index alone says what is stored (a row is written only once the
	// store has the object).
	EnvHookIndexOnly = "PACKWIRE_LFS_INDEX_ONLY"
	// EnvHookDatabase: the index is a cluster's, in this PostgreSQL
	// database.
	EnvHookDatabase = "PACKWIRE_LFS_DATABASE"
	// HookName is the hook's name in the hooks directory.
	HookName = "pre-receive"
)

// PushEnv is what receive-pack's environment needs for the hook.
func (s *Service) PushEnv(repoName string) []string {
	env := []string{"PACKWIRE_HOOK=" + HookName, EnvHookDir + "=" + s.Dir, EnvHookRepo + "=" + repoName}
	if _, ok := s.Objects.(*Disk); !ok {
		env = append(env, EnvHookIndexOnly+"=1")
	}
	if s.Database != "" {
		env = append(env, EnvHookDatabase+"="+s.Database)
	}
	return env
}

// RunHook is the pre-receive hook: stdin has "old new ref" lines.
func RunHook(stdin io.Reader, stderr io.Writer) int {
	dir, repoName := os.Getenv(EnvHookDir), os.Getenv(EnvHookRepo)
	if dir == "" || repoName == "" {
		return 0 // not asked to check
	}
	var tips []string
	sc := bufio.NewScanner(stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 3 && oid.Valid(f[1]) && strings.Trim(f[1], "0") != "" {
			tips = append(tips, f[1])
		}
	}
	if len(tips) == 0 {
		return 0
	}
	ctx := context.Background()
	if q := os.Getenv("GIT_QUARANTINE_PATH"); q != "" {
		maybe, err := pushedPointer(ctx, q)
		if err != nil {
			fmt.Fprintf(stderr, "packwire: checking LFS pointers: %v\n", err)
			return 1
		}
		if !maybe {
			return 0
		}
	}
	pointers, err := newPointers(ctx, tips)
	if err != nil {
		fmt.Fprintf(stderr, "packwire: checking LFS pointers: %v\n", err)
		return 1
	}
	if len(pointers) == 0 {
		return 0
	}
	var index *Index
	if db := os.Getenv(EnvHookDatabase); db != "" {
		index, err = OpenIndexPostgres(ctx, db)
	} else {
		index, err = OpenIndex(ctx, filepath.Join(dir, IndexFile))
	}
	if err != nil {
		fmt.Fprintf(stderr, "packwire: checking LFS pointers: %v\n", err)
		return 1
	}
	defer index.Close()
	var disk Store = &Disk{Dir: dir}
	if os.Getenv(EnvHookIndexOnly) != "" {
		disk = nil
	}
	for _, p := range pointers {
		size, held, err := index.Size(ctx, repoName, p.OID)
		if err != nil {
			fmt.Fprintf(stderr, "packwire: checking LFS pointers: %v\n", err)
			return 1
		}
		stored := held
		if disk != nil {
			_, stored = disk.Stat(p.OID)
		}
		if !held || !stored || size != p.Size {
			fmt.Fprintf(stderr, "packwire: your push references an LFS object this repository does not have: %s (%s, %d bytes)\n", p.OID, p.path, p.Size)
			fmt.Fprintf(stderr, "packwire: upload it first with 'git lfs push --all REMOTE', then push again\n")
			return 1
		}
	}
	return 0
}

// pushedPointer reports whether the pushed objects, those in the
// quarantine, include a blob that is an LFS pointer: cat-file lists them
// from the pack's index (no walk of the history, which costs several
// times more on a large push) and reads only the small blobs. Most pushes
// have none, and the check ends here; otherwise newPointers walks from
// the tips to tell which pointers are new and where.
func pushedPointer(ctx context.Context, quarantine string) (bool, error) {
	env := []string{"GIT_OBJECT_DIRECTORY=" + quarantine}
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "GIT_ALTERNATE_OBJECT_DIRECTORIES=") && !strings.HasPrefix(e, "GIT_OBJECT_DIRECTORY=") {
			env = append(env, e) // the repository's own objects are not the push's
		}
	}
	list := exec.CommandContext(ctx, "git", "cat-file", "--batch-all-objects", "--unordered", "--batch-check=%(objectname) %(objecttype) %(objectsize)")
	list.Env = env
	out, err := list.Output()
	if err != nil {
		return false, fmt.Errorf("git cat-file --batch-all-objects: %w", err)
	}
	var small bytes.Buffer
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[1] != "blob" {
			continue
		}
		if n, err := strconv.Atoi(f[2]); err == nil && n <= MaxPointerSize {
			small.WriteString(f[0] + "\n")
		}
	}
	if small.Len() == 0 {
		return false, nil
	}
	found, err := readPointers(ctx, env, &small)
	return len(found) > 0, err
}

type newPointer struct {
	Pointer
	id   string // the pointer blob's
	path string
}

// newPointers lists the LFS pointers among the blobs the tips bring that
// no ref reached before. One rev-list names only the new blobs small
// enough to be a pointer (git filters by type and size from the object
// headers, reading no content); a push with none, most pushes of a
// repository without LFS, ends there. cat-file --batch reads the rest.
func newPointers(ctx context.Context, tips []string) ([]newPointer, error) {
	args := []string{"rev-list", "--objects", "--filter=object:type=blob", "--filter=blob:limit=" + strconv.Itoa(MaxPointerSize+1)}
	args = append(args, tips...)
	args = append(args, "--not", "--all")
	out, err := exec.CommandContext(ctx, "git", args...).Output()
	if err != nil {
		return nil, fmt.Errorf("git rev-list: %w", err)
	}
	paths := map[string]string{}
	var small bytes.Buffer
	for _, line := range strings.Split(string(out), "\n") {
		id, path, ok := strings.Cut(line, " ")
		if !ok || path == "" {
			continue // a commit (trees and large blobs are filtered out)
		}
		if _, seen := paths[id]; !seen {
			small.WriteString(id + "\n")
		}
		paths[id] = path
	}
	if small.Len() == 0 {
		return nil, nil
	}
	found, err := readPointers(ctx, nil, &small)
	for i := range found {
		found[i].path = paths[found[i].id]
	}
	return found, err
}

// readPointers reads the blobs ids names (one a line) with cat-file
// --batch and returns those that are LFS pointers (env nil: the hook's).
func readPointers(ctx context.Context, env []string, ids io.Reader) ([]newPointer, error) {
	read := exec.CommandContext(ctx, "git", "cat-file", "--batch")
	read.Stdin, read.Env = ids, env
	out, err := read.Output()
	if err != nil {
		return nil, fmt.Errorf("git cat-file --batch: %w", err)
	}
	var found []newPointer
	for len(out) > 0 {
		header, rest, ok := bytes.Cut(out, []byte("\n"))
		f := strings.Fields(string(header))
		if !ok || len(f) != 3 {
			break
		}
		n, err := strconv.Atoi(f[2])
		if err != nil || n+1 > len(rest) {
			break
		}
		if p, ok := ParsePointer(rest[:n]); ok {
			found = append(found, newPointer{Pointer: p, id: f[0]})
		}
		out = rest[n+1:]
	}
	return found, nil
}
