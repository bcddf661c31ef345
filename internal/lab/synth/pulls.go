package synth

import (
	"fmt"
	"math/rand/v2"
	"path"
	"slices"
	"strings"
)

// MaxPullRefs bounds Options.PullRefs (a hosted repository with a million
// pull requests is past anything the lab needs).
const MaxPullRefs = 1_000_000

// pullRequests writes refs/pull/K/head as hosted repositories carry them:
// a pull request is a short branch off a commit of main, never merged, so
// no branch or tag reaches it and clones never fetch it. Pull K is opened
// when the history has written K/N of its commits, off main's tip then.
//
// Its size follows a survey of 10,193 merged GitHub pull requests
// (Packmind, "Observations on +10,000 Pull Requests on GitHub", 2021):
// commits median 1, third quartile 3; files changed median 3, quartiles 1
// and 10; lines added median 21 in 4 chunks. The first commit edits every
// file of the pull request, by a few lines each; a later commit (review
// follow-ups) edits one or two of them again.
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

// Bounds of a pull request's size: the survey's tails (a mean of 36 files)
// come from mass edits that the lab does not need to model.
const (
	maxPullCommits = 20
	maxPullFiles   = 20
)

// pullCommits draws how many commits a pull request has: 1 + floor(x),
// x log-normal with median 1 and sigma 1.2, so half have one commit and
// the third quartile is 3.
func pullCommits(rng *rand.Rand) int {
	return min(maxPullCommits, 1+int(logNormal(rng, 1, 1.2)))
}

// pullFiles draws how many files a pull request changes: 1 + floor(x), x
// log-normal with median 2.5 and sigma 1.9, for quartiles 1, 3 and 10.
func pullFiles(rng *rand.Rand) int {
	return min(maxPullFiles, 1+int(logNormal(rng, 2.5, 1.9)))
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

// openPullRequest writes the commits of the next refs/pull/K/head, off
// main's tip.
func (g *generator) openPullRequest() {
	p := &g.pulls
	p.done++
	root := g.main.root
	onMain := func(f *fileRec) bool {
		if !f.alive || f.mode == modeLink {
			return false
		}
		n := lookup(root, f.parts)
		return n != nil && n.text != nil
	}
	var files []*fileRec
	area := -1
	for want := pullFiles(p.rng); len(files) < want; {
		f := g.cat.popular(p.rng, area, func(f *fileRec) bool { return onMain(f) && !slices.Contains(files, f) })
		if f == nil {
			break
		}
		files = append(files, f)
		area = f.area // a pull request's files are mostly of one area
	}
	if len(files) == 0 {
		i := slices.IndexFunc(g.cat.files, onMain)
		if i < 0 {
			return // no text file at all: nothing a pull request could edit
		}
		files = append(files, g.cat.files[i])
	}

	ref := fmt.Sprintf("refs/pull/%d/head", p.done)
	parent := g.main.tip
	who := g.people[p.rng.IntN(len(g.people))]
	when := g.mainWhen + 3600 + p.rng.Int64N(14*24*3600) // opened some hours to two weeks after its base
	verbs := []string{"Fix", "Improve", "Handle", "Add", "Avoid", "Simplify", "Support", "Update"}
	commits := pullCommits(p.rng)
	for c := range commits {
		edit := files
		msg := fmt.Sprintf("%s %s %s in %s\n", verbs[p.rng.IntN(len(verbs))], words[p.rng.IntN(len(words)-20)],
			words[p.rng.IntN(len(words)-20)], path.Base(files[0].path))
		if c > 0 {
			edit = []*fileRec{files[p.rng.IntN(len(files))]}
			if len(files) > 1 && p.rng.IntN(2) == 0 {
				edit = append(edit, files[p.rng.IntN(len(files))])
			}
			if len(edit) == 2 && edit[0] == edit[1] {
				edit = edit[:1]
			}
			when += 600 + p.rng.Int64N(3*24*3600) // review follow-ups: minutes to days later
			msg = fmt.Sprintf("Address review: %s %s\n", words[p.rng.IntN(len(words)-20)], path.Base(edit[0].path))
		}
		var changes []string
		for _, f := range edit {
			old := lookup(root, f.parts)
			n := &node{name: old.name, mode: old.mode, text: old.text.propose(p.rng, p.nextLine)}
			g.buf = n.text.render(g.buf[:0])
			n.size = len(g.buf)
			n.oid = objectID("blob", g.buf)
			g.marks++
			g.pending = append(g.pending, pendingBlob{path: f.path, seq: len(g.pending), mark: g.marks, data: slices.Clone(g.buf)})
			g.pendingBytes += len(g.buf)
			if g.seenBlobs.add(n.oid) {
				p.blobs++
			}
			root = setPath(root, f.parts, n) // copies the directories on the path; main's stay as they are
			changes = append(changes, fmt.Sprintf("M %o :%d %s\n", n.mode, g.marks, f.path))
		}
		p.trees += g.hash.seal(root, g.seenTrees)

		g.marks++
		p.commits++
		fmt.Fprintf(&g.w, "commit %s\nmark :%d\nauthor %s %d %s\ncommitter %s %d %s\ndata %d\n%sfrom :%d\n%s\n",
			ref, g.marks, who.ident, when, who.tz, who.ident, when, who.tz, len(msg), msg, parent, strings.Join(changes, ""))
		parent = g.marks
	}
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
