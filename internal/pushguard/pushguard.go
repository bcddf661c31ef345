// Package pushguard decides fast-forward for the ref updates packwire
// allows only as fast-forwards, in every ref namespace, once the pushed
// objects are in the repository and before any ref moves.
//
// git's own receive.denyNonFastForwards checks refs/heads/ only and applies
// to a whole push. Instead receive-pack is given receive.procReceiveRefs
// for every update of an existing ref, so it hands those commands to its
// proc-receive hook: this package, run as packwire's binary in hook mode
// (PACKWIRE_HOOK=proc-receive). The hook reads the list of fast-forward-only
// refs the pipeline decided, refuses each such update that is not a
// fast-forward ("ng REF protected: force-push denied") and answers every
// other command "ok" with "option fall-through", which lets receive-pack
// apply it exactly as it would have without the hook. One hook process
// per push, whatever its number of refs; git still moves every ref.
package pushguard

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"packwire/internal/pktline"
)

const (
	// HookName is the hook's file name in the hooks directory.
	HookName = "proc-receive"
	// EnvFFOnly names the file listing the fast-forward-only refs of the
	// push, one a line (receive-pack passes its environment to hooks).
	EnvFFOnly = "PACKWIRE_FF_ONLY"
	// ForceDenied is the reason a refused update is reported with.
	ForceDenied = "protected: force-push denied"
)

// Config returns the git -c settings that route every update of an
// existing ref ("m:" modify, in any namespace under refs/) of a push to
// the hook in hooksDir.
func Config(hooksDir string) []string {
	return []string{"core.hooksPath=" + hooksDir, "receive.procReceiveRefs=m:refs"}
}

// InstallHook makes dir a hooks directory whose proc-receive hook is
// executable (packwire's own binary: a symlink, so an upgraded binary is
// used at once). Only this hook is there: packwire runs no hook a
// repository carries.
func InstallHook(dir, executable string) error {
	return InstallHookAs(dir, HookName, executable)
}

// InstallHookAs links the hook name in dir to executable (the LFS push
// check is pre-receive beside proc-receive).
func InstallHookAs(dir, name, executable string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	link := filepath.Join(dir, name)
	if target, err := os.Readlink(link); err == nil && target == executable {
		return nil
	}
	tmp := link + ".tmp"
	os.Remove(tmp)
	if err := os.Symlink(executable, tmp); err != nil {
		return err
	}
	return os.Rename(tmp, link)
}

// WriteRefs writes the fast-forward-only refs of one push to a new file in
// dir and returns its path, for EnvFFOnly. The caller removes it.
func WriteRefs(dir string, refs []string) (string, error) {
	f, err := os.CreateTemp(dir, "ff-only-*")
	if err != nil {
		return "", err
	}
	w := bufio.NewWriter(f)
	for _, r := range refs {
		w.WriteString(r)
		w.WriteByte('\n')
	}
	err = w.Flush()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// Command is one ref update receive-pack hands the hook.
type Command struct{ Old, New, Ref string }

// Result is the hook's answer for one command: Reason empty lets
// receive-pack apply it.
type Result struct {
	Ref    string
	Reason string
}

// RunHook is the whole life of the hook process: the proc-receive protocol
// on stdin/stdout (githooks(5)), with git run in the repository (the
// working directory receive-pack gives its hooks). It returns the exit
// status; a failure refuses every command it was given, so a broken hook
// never lets a protected ref be forced.
func RunHook(stdin io.Reader, stdout, stderr io.Writer) int {
	in := pktline.NewReader(bufio.NewReader(stdin))
	out := bufio.NewWriter(stdout)
	if err := negotiate(in, out); err != nil {
		fmt.Fprintf(stderr, "packwire proc-receive: %v\n", err)
		return 1
	}
	cmds, err := readCommands(in)
	if err != nil {
		fmt.Fprintf(stderr, "packwire proc-receive: %v\n", err)
		return 1
	}
	ffOnly, err := readRefs(os.Getenv(EnvFFOnly))
	var results []Result
	if err != nil {
		fmt.Fprintf(stderr, "packwire proc-receive: reading push rules: %v\n", err)
		for _, c := range cmds {
			results = append(results, Result{Ref: c.Ref, Reason: "packwire could not read its push rules"})
		}
	} else {
		git := &GitAncestry{}
		results = Decide(context.Background(), git, cmds, ffOnly)
		git.Close()
	}
	for _, r := range results {
		if r.Reason != "" {
			pktline.Writef(out, "ng %s %s\n", r.Ref, r.Reason)
			continue
		}
		pktline.Writef(out, "ok %s\n", r.Ref)
		pktline.Writef(out, "option fall-through\n")
	}
	pktline.WriteFlush(out)
	if err := out.Flush(); err != nil {
		return 1
	}
	return 0
}

// negotiate answers receive-pack's version line: version 1, no features
// (push options are not needed to decide).
func negotiate(in *pktline.Reader, out *bufio.Writer) error {
	version := ""
	for {
		kind, line, err := in.Read()
		if err != nil {
			return fmt.Errorf("reading version: %w", err)
		}
		if kind == pktline.Flush {
			break
		}
		if version == "" {
			v, _, _ := strings.Cut(strings.TrimSuffix(string(line), "\n"), "\x00")
			version = v
		}
	}
	if version != "version=1" {
		return fmt.Errorf("unsupported proc-receive protocol %q", version)
	}
	pktline.Writef(out, "version=1\n")
	pktline.WriteFlush(out)
	return out.Flush()
}

func readCommands(in *pktline.Reader) ([]Command, error) {
	var cmds []Command
	for {
		kind, line, err := in.Read()
		if err != nil {
			return nil, fmt.Errorf("reading commands: %w", err)
		}
		if kind == pktline.Flush {
			return cmds, nil
		}
		f := strings.Fields(string(line))
		if len(f) != 3 {
			return nil, fmt.Errorf("malformed command %q", line)
		}
		cmds = append(cmds, Command{Old: f[0], New: f[1], Ref: f[2]})
	}
}

func readRefs(path string) (map[string]bool, error) {
	if path == "" {
		return nil, errors.New(EnvFFOnly + " is not set")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	refs := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" {
			refs[l] = true
		}
	}
	return refs, nil
}

// Ancestry answers what Decide needs to know about objects.
type Ancestry interface {
	// Types returns each id's object type ("commit", "tag", ...; "missing").
	Types(ctx context.Context, ids []string) (map[string]string, error)
	// IsAncestor reports whether commit old is an ancestor of commit new.
	IsAncestor(ctx context.Context, old, new string) (bool, error)
}

// Decide answers each command in order: an update of a ref in ffOnly goes
// through only if old and new are commits and old is an ancestor of new
// (anything else, a tag object or a missing object included, is not a
// fast-forward); every other command goes through.
func Decide(ctx context.Context, a Ancestry, cmds []Command, ffOnly map[string]bool) []Result {
	results := make([]Result, len(cmds))
	var check []int
	var ids []string
	for i, c := range cmds {
		results[i].Ref = c.Ref
		if ffOnly[c.Ref] {
			check = append(check, i)
			ids = append(ids, c.Old, c.New)
		}
	}
	if len(check) == 0 {
		return results
	}
	types, err := a.Types(ctx, ids)
	if err != nil {
		for _, i := range check {
			results[i].Reason = "packwire could not check fast-forward: " + oneLine(err.Error())
		}
		return results
	}
	// merge-base runs per ref: at most a few at once.
	sem := make(chan struct{}, min(4, max(1, runtime.NumCPU())))
	var wg sync.WaitGroup
	for _, i := range check {
		c := cmds[i]
		if types[c.Old] != "commit" || types[c.New] != "commit" {
			results[i].Reason = ForceDenied
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ok, err := a.IsAncestor(ctx, c.Old, c.New)
			switch {
			case err != nil:
				results[i].Reason = "packwire could not check fast-forward: " + oneLine(err.Error())
			case !ok:
				results[i].Reason = ForceDenied
			}
		}()
	}
	wg.Wait()
	return results
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}

// GitAncestry asks git in the current directory's repository (receive-pack
// runs its hooks there, with GIT_DIR set). One "cat-file --batch-command"
// answers the object types and walks a short way back from each new
// commit: a fast-forward is usually a few commits ahead of the old one,
// and a push of 5,000 fast-forwarded branches then costs one process, not
// 5,000. Only when that walk neither finds the old commit nor runs out of
// ancestors does "merge-base --is-ancestor" decide.
type GitAncestry struct {
	GitPath string
	// WalkBudget is how many commits the short walk reads per update
	// before it leaves the question to merge-base (0: DefaultWalkBudget).
	WalkBudget int

	mu    sync.Mutex
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
	err   error
}

// DefaultWalkBudget bounds the short walk per update.
const DefaultWalkBudget = 256

func (g *GitAncestry) git() string {
	if g.GitPath == "" {
		return "git"
	}
	return g.GitPath
}

// batch starts the cat-file process on first use; call with mu held.
func (g *GitAncestry) batch(ctx context.Context) error {
	if g.cmd != nil || g.err != nil {
		return g.err
	}
	cmd := exec.CommandContext(ctx, g.git(), "cat-file", "--batch-command")
	stdin, err := cmd.StdinPipe()
	if err == nil {
		var out io.ReadCloser
		if out, err = cmd.StdoutPipe(); err == nil {
			g.out = bufio.NewReaderSize(out, 64<<10)
			err = cmd.Start()
		}
	}
	if err != nil {
		g.err = fmt.Errorf("cat-file: %w", err)
		return g.err
	}
	g.cmd, g.stdin = cmd, stdin
	return nil
}

// Close ends the cat-file process.
func (g *GitAncestry) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cmd == nil {
		return nil
	}
	g.stdin.Close()
	err := g.cmd.Wait()
	g.cmd = nil
	return err
}

// object asks for one object: its type, and its contents when contents.
func (g *GitAncestry) object(id string, contents bool) (typ string, body []byte, err error) {
	verb := "info"
	if contents {
		verb = "contents"
	}
	if _, err := fmt.Fprintf(g.stdin, "%s %s\n", verb, id); err != nil {
		return "", nil, err
	}
	header, err := g.out.ReadString('\n')
	if err != nil {
		return "", nil, err
	}
	f := strings.Fields(header)
	switch {
	case len(f) == 2 && f[1] == "missing":
		return "missing", nil, nil
	case len(f) != 3:
		return "", nil, fmt.Errorf("cat-file: unexpected %q", header)
	}
	if !contents {
		return f[1], nil, nil
	}
	var size int
	if _, err := fmt.Sscan(f[2], &size); err != nil {
		return "", nil, err
	}
	body = make([]byte, size+1) // and the newline after it
	if _, err := io.ReadFull(g.out, body); err != nil {
		return "", nil, err
	}
	return f[1], body[:size], nil
}

// Types asks the batch process for every id's type.
func (g *GitAncestry) Types(ctx context.Context, ids []string) (map[string]string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.batch(ctx); err != nil {
		return nil, err
	}
	types := make(map[string]string, len(ids))
	for _, id := range ids {
		typ, _, err := g.object(id, false)
		if err != nil {
			return nil, fmt.Errorf("cat-file: %w", err)
		}
		types[id] = typ
	}
	return types, nil
}

// IsAncestor reports whether commit old is an ancestor of commit new.
func (g *GitAncestry) IsAncestor(ctx context.Context, old, new string) (bool, error) {
	found, decided, err := g.shortWalk(ctx, old, new)
	if err == nil && decided {
		return found, nil
	}
	return g.mergeBase(ctx, old, new)
}

// shortWalk reads new's ancestors breadth first, up to the budget: finding
// old proves a fast-forward; running out of ancestors disproves it;
// running out of budget decides nothing.
func (g *GitAncestry) shortWalk(ctx context.Context, old, new string) (found, decided bool, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.batch(ctx); err != nil {
		return false, false, err
	}
	budget := g.WalkBudget
	if budget <= 0 {
		budget = DefaultWalkBudget
	}
	queue := []string{new}
	seen := map[string]bool{new: true}
	for len(queue) > 0 {
		id := queue[0]
		queue = queue[1:]
		if id == old {
			return true, true, nil
		}
		if budget--; budget < 0 {
			return false, false, nil
		}
		typ, body, err := g.object(id, true)
		if err != nil {
			return false, false, err
		}
		if typ != "commit" {
			return false, false, fmt.Errorf("%s is a %s", id, typ)
		}
		for _, line := range strings.Split(string(body), "\n") {
			if line == "" {
				break // the end of the header
			}
			if parent, ok := strings.CutPrefix(line, "parent "); ok && !seen[parent] {
				seen[parent] = true
				queue = append(queue, parent)
			}
		}
	}
	return false, true, nil
}

// mergeBase runs merge-base --is-ancestor: exit 0 yes, 1 no.
func (g *GitAncestry) mergeBase(ctx context.Context, old, new string) (bool, error) {
	cmd := exec.CommandContext(ctx, g.git(), "merge-base", "--is-ancestor", old, new)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &exit) && exit.ExitCode() == 1:
		return false, nil
	default:
		return false, fmt.Errorf("merge-base: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
}
