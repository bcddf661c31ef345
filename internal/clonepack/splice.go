package clonepack

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"packwire/internal/maintain"
)

// SpliceOutcome is what the governor records for a clone answered with
// the preferred pack followed by a thin pack of what was pushed since.
const SpliceOutcome = "clone-splice"

// MaxThinPack bounds the thin pack a splice holds in memory: a push
// bigger than this is answered by git.
const MaxThinPack = 64 << 20

// Splice is the answer to a full clone after pushes that only added: the
// preferred pack's entries copied as they are (OFS_DELTA offsets are
// relative, so a contiguous copy stays valid), then the entries of a thin
// pack of what the wants have beyond the pack's tips (git pack-objects
// selects them and computes their deltas; its REF_DELTA bases are in the
// preferred pack, earlier in the same stream), a header counting both and
// a trailer computed anew.
type Splice struct {
	base      *Pack
	baseCount uint32
	thin      []byte // the thin pack, header and trailer included
	// UserCPU and SysCPU are what git's runs cost, GitRuns how many ran:
	// one (the thin pack), two when an old tip had to be asked of git.
	UserCPU, SysCPU time.Duration
	GitRuns         int
}

// OpenSplice prepares the splice answering c from the repository at dir:
// ErrNotClone when the preferred pack is not all wanted any more (a
// branch rewound or deleted, a tag removed) or anything else does not
// fit; git answers then. beforeGit is called before git runs (the
// caller's admission); its error is returned as it is.
func OpenSplice(ctx context.Context, dir string, c Clone, beforeGit func() error) (*Splice, error) {
	st, err := maintain.ReadState(dir)
	if err != nil || st == nil || st.TipsDigest == "" || len(st.Preferred) != len("pack-.pack")+40 {
		return nil, ErrNotClone // none recorded, or not SHA-1 (the trailer written here is)
	}
	old, err := maintain.PreferredTips(dir)
	if err != nil || len(old) == 0 || maintain.TipsDigest(old) != st.TipsDigest {
		return nil, ErrNotClone // a run in progress wrote one file of the two
	}
	base, err := Open(dir, Clone{Wants: old, V2: c.V2, Band: c.Band})
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			base.Close()
		}
	}()
	var head [12]byte
	if _, err := base.f.ReadAt(head[:], 0); err != nil {
		return nil, err
	}
	sp := &Splice{base: base, baseCount: binary.BigEndian.Uint32(head[8:])}
	if binary.BigEndian.Uint32(head[4:8]) != 2 {
		return nil, ErrNotClone
	}
	if err := beforeGit(); err != nil {
		return nil, err
	}
	var in strings.Builder
	for _, w := range c.Wants {
		in.WriteString(w + "\n")
	}
	for _, t := range old {
		in.WriteString("^" + t + "\n")
	}
	// Without the bitmap: for a few pushed commits the walk is tiny, and
	// the bitmap's way sent the new objects whole (38 KB instead of 5.6 KB
	// for one commit of the benchmark's synth jquery, 20 ms of CPU instead
	// of under 10).
	thin, err := sp.git(ctx, dir, in.String(), MaxThinPack, "pack-objects", "--stdout", "--thin", "--revs", "--delta-base-offset", "--no-use-bitmap-index", "-q")
	if err != nil {
		return nil, err
	}
	if len(thin) < 32 || string(thin[:4]) != "PACK" || binary.BigEndian.Uint32(thin[4:8]) != 2 {
		return nil, fmt.Errorf("%w: pack-objects wrote no pack", ErrNotClone)
	}
	// Every object of the preferred pack must still be wanted: every old
	// tip reachable from the wants (a tag object counts).
	if err := sp.checkOldTips(ctx, dir, old, c.Wants, thin); err != nil {
		return nil, err
	}
	sp.thin = thin
	ok = true
	return sp, nil
}

// checkOldTips proves that every old tip is reachable from the wants, so
// the preferred pack holds nothing a clone does not want; ErrNotClone
// when one is not (a branch rewound or deleted, a tag removed or moved).
// Most old tips are still wanted, and one a push moved forward is usually
// a parent of a commit the thin pack carries, every one of which the
// wants reach: no git. Only the old tips left are asked of git (a walk
// from them to the wants, without the bitmap: loading it cost 40 ms on
// jquery's history, the walk a few).
func (sp *Splice) checkOldTips(ctx context.Context, dir string, old, wants []string, thin []byte) error {
	wanted := make(map[string]bool, len(wants))
	for _, w := range wants {
		wanted[w] = true
	}
	var moved []string
	for _, t := range old {
		if !wanted[t] {
			moved = append(moved, t)
		}
	}
	if len(moved) == 0 {
		return nil
	}
	parents := thinParents(thin)
	left := moved[:0]
	for _, t := range moved {
		if !parents[t] {
			left = append(left, t)
		}
	}
	if len(left) == 0 {
		return nil
	}
	var in strings.Builder
	for _, t := range left {
		in.WriteString(t + "\n")
	}
	for _, w := range wants {
		in.WriteString("^" + w + "\n")
	}
	out, err := sp.git(ctx, dir, in.String(), 64, "rev-list", "--objects", "--count", "--stdin")
	if err != nil {
		return err
	}
	if strings.TrimSpace(string(out)) != "0" {
		return ErrNotClone // rewound, deleted: the pack holds what is not wanted
	}
	return nil
}

// git runs git in dir with stdin, keeping at most limit bytes of its
// output (more: ErrNotClone), and adds its CPU to the splice's.
func (sp *Splice) git(ctx context.Context, dir, stdin string, limit int64, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_DIR="+dir)
	cmd.Stdin = strings.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	out, rerr := io.ReadAll(io.LimitReader(stdout, limit+1))
	if int64(len(out)) > limit {
		cmd.Process.Kill()
	}
	werr := cmd.Wait()
	sp.GitRuns++
	if cmd.ProcessState != nil {
		sp.UserCPU += cmd.ProcessState.UserTime()
		sp.SysCPU += cmd.ProcessState.SystemTime()
	}
	switch {
	case int64(len(out)) > limit:
		return nil, fmt.Errorf("%w: git %s wrote more than %d bytes", ErrNotClone, args[0], limit)
	case rerr != nil:
		return nil, rerr
	case werr != nil:
		return nil, fmt.Errorf("git %s: %v: %s", args[0], werr, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}

// WriteResponse writes the answer: the header with both counts, the
// preferred pack's entries, the thin pack's, and the SHA-1 of all that,
// framed as Pack.WriteResponse frames a pack.
func (sp *Splice) WriteResponse(w io.Writer, c Clone) (int64, error) {
	f, err := newFramer(w, c)
	if err != nil {
		return 0, err
	}
	sum := len(sp.thin) - 20 // the thin pack's trailer (SHA-1 repositories only)
	thinCount := binary.BigEndian.Uint32(sp.thin[8:12])
	if sp.base.size-12-20 < 0 || sum < 12 || uint64(sp.baseCount)+uint64(thinCount) > 1<<32-1 {
		return 0, ErrNotClone
	}
	var head [12]byte
	copy(head[:], "PACK\x00\x00\x00\x02")
	binary.BigEndian.PutUint32(head[8:], sp.baseCount+thinCount)
	h := sha1.New()
	h.Write(head[:])
	if err := f.write(head[:]); err != nil {
		return f.written, err
	}
	if err := copyRange(f, sp.base.f, 12, sp.base.size-20, h); err != nil {
		return f.written, err
	}
	h.Write(sp.thin[12:sum])
	if err := f.write(sp.thin[12:sum]); err != nil {
		return f.written, err
	}
	if err := f.write(h.Sum(nil)); err != nil {
		return f.written, err
	}
	return f.end()
}

// Close closes the preferred pack.
func (sp *Splice) Close() error { return sp.base.Close() }
