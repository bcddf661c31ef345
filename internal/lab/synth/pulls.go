package synth

import (
	"fmt"
	"math/rand/v2"
	"path"
	"slices"
)

// MaxPullRefs bounds Options.PullRefs (a hosted repository with a million
// pull requests is past anything the lab needs).
const MaxPullRefs = 1_000_000

// pullRequests writes refs/pull/K/head as hosted repositories carry them:
// a side commit off a commit of main that edits one file of its tree the
// way a pull request does, never merged, so no branch or tag reaches it
// and clones never fetch it. Pull K is opened when the history has written
// K/N of its commits, off main's tip at that time.
//
// It draws from its own random source and line seeds, so a repository
// made with pull refs has the same branches, tags and object ids as one
// made without: only the pull refs and their objects are added.
type pullRequests struct {
	want, done int
	rng        *rand.Rand
	lineSeq    uint64

	// What they added to git's objects (the generator's counts stay the
	// shape's, which steering aims at).
	commits, trees, blobs int
}

// pullSalt separates the pull requests' random streams from the history's.
const pullSalt = 0x70756c6c72657173 // "pullreqs"

func newPullRequests(n int, seed int64, nameSeed uint64) pullRequests {
	return pullRequests{want: n, rng: rand.New(rand.NewPCG(uint64(seed)^pullSalt, nameSeed^pullSalt))}
}

func (p *pullRequests) nextLine() uint32 {
	p.lineSeq++
	return uint32(mix64(p.lineSeq*0x9e3779b97f4a7c15 ^ pullSalt))
}

// openDue writes the pull requests due after the commits written so far.
// Every branch's tree is sealed between steps, so main's may be shared.
func (g *generator) openDue() {
	p := &g.pulls
	for p.done < p.want && int64(g.commits)*int64(p.want) >= int64(p.done+1)*int64(g.t.commits) {
		g.openPullRequest()
	}
}

// openPullRequest writes the next refs/pull/K/head off main's tip.
func (g *generator) openPullRequest() {
	p := &g.pulls
	p.done++
	onMain := func(f *fileRec) bool {
		if !f.alive || f.mode == modeLink {
			return false
		}
		n := lookup(g.main.root, f.parts)
		return n != nil && n.text != nil
	}
	f := g.cat.popular(p.rng, -1, onMain)
	if f == nil {
		i := slices.IndexFunc(g.cat.files, onMain)
		if i < 0 {
			return // no text file at all: nothing a pull request could edit
		}
		f = g.cat.files[i]
	}
	old := lookup(g.main.root, f.parts)
	n := &node{name: old.name, mode: old.mode, text: old.text.propose(p.rng, p.nextLine)}
	g.buf = n.text.render(g.buf[:0])
	n.size = len(g.buf)
	n.oid = objectID("blob", g.buf)
	g.marks++
	blobMark := g.marks
	g.pending = append(g.pending, pendingBlob{path: f.path, seq: len(g.pending), mark: blobMark, data: slices.Clone(g.buf)})
	g.pendingBytes += len(g.buf)
	if g.seenBlobs.add(n.oid) {
		p.blobs++
	}
	root := setPath(g.main.root, f.parts, n) // copies the directories on the path; main's stay as they are
	p.trees += g.hash.seal(root, g.seenTrees)

	g.marks++
	p.commits++
	who := g.people[p.rng.IntN(len(g.people))]
	when := g.mainWhen + 3600 + p.rng.Int64N(14*24*3600) // opened some hours to two weeks after its base
	verbs := []string{"Fix", "Improve", "Handle", "Add", "Avoid", "Simplify", "Support", "Update"}
	msg := fmt.Sprintf("%s %s %s in %s\n", verbs[p.rng.IntN(len(verbs))], words[p.rng.IntN(len(words)-20)],
		words[p.rng.IntN(len(words)-20)], path.Base(f.path))
	fmt.Fprintf(&g.w, "commit refs/pull/%d/head\nmark :%d\nauthor %s %d %s\ncommitter %s %d %s\ndata %d\n%sfrom :%d\nM %o :%d %s\n\n",
		p.done, g.marks, who.ident, when, who.tz, who.ident, when, who.tz, len(msg), msg, g.main.tip, n.mode, blobMark, f.path)
}

// propose returns the file as a pull request changes it: a few lines
// inserted at one place and, half the time, a few lines changed at
// another, so the new version is a close relative of the old one.
func (t *fileText) propose(rng *rand.Rand, nextLine func() uint32) *fileText {
	lines := slices.Clone(t.lines)
	fresh := func(n int) []uint32 { return freshLines(n, nextLine) }
	at := rng.IntN(len(lines) + 1)
	lines = slices.Insert(lines, at, fresh(1+rng.IntN(8))...)
	if rng.IntN(2) == 0 {
		at := rng.IntN(len(lines))
		n := min(1+rng.IntN(3), len(lines)-at)
		lines = slices.Replace(lines, at, at+n, fresh(n)...)
	}
	return &fileText{lang: t.lang, vocab: t.vocab, lines: lines, target: t.target}
}
