package synth

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
)

// targets are the counts a generated history aims at.
type targets struct {
	commits, trees, blobs int
	files                 int // files in main's checkout at the end
	initial               int // files of the first commit
	adds, deletes         int // files added and deleted after the first commit
	mainTags              int
	releases              int
}

func targetsFor(sh *shape, scale float64) (targets, error) {
	t := targets{
		commits: int(math.Round(scale * float64(sh.commits))),
		trees:   int(math.Round(scale * float64(sh.trees))),
		blobs:   int(math.Round(scale * float64(sh.blobs))),
	}
	if t.commits < minCommits {
		return t, fmt.Errorf("scale %g is too small for shape %s: it gives %d commits, the least is %d (scale %.4g)",
			scale, sh.name, t.commits, minCommits, float64(minCommits)/float64(sh.commits))
	}
	t.files = max(int(math.Round(scale*float64(sh.files))), min(40, t.blobs/4))
	t.initial = max(2, int(math.Round(sh.initialFiles*float64(t.files))))
	grow := t.files - t.initial
	t.deletes = grow * 8 / 100
	t.adds = grow + t.deletes
	t.mainTags = max(2, int(math.Round(scale*float64(sh.tags)*0.85)))
	t.releases = max(1, int(math.Round(scale*float64(sh.releaseBranches))))
	return t, nil
}

// minCommits is the smallest history worth the name of a shape.
const minCommits = 50

// branch is a line of history being written: main, a topic or a release.
type branch struct {
	ref  string
	root *node
	tip  int // mark of the last commit

	// topics
	area          int
	planned, done int
	changed       []*fileRec // files changed since the fork, first change first
	changedSet    map[*fileRec]bool

	// releases
	index, tagged int
}

type person struct {
	ident string // "Name <email>"
	tz    string
}

// generator writes a fast-import stream of one shape's history while
// keeping the exact count of the objects it creates.
type generator struct {
	sh  *shape
	t   targets
	rng *rand.Rand
	out *bufio.Writer // the fast-import stream
	w   bytes.Buffer  // commands of the current chunk of history
	// Blobs of the current chunk, written before its commands grouped by
	// path: fast-import deltas a blob only against the blob written just
	// before it, so versions of a file written together become deltas.
	pending      []pendingBlob
	pendingBytes int
	cat          *catalog
	hash         hasher

	seenTrees, seenBlobs        objectSet
	commits, trees, blobs, tags int
	merges, mergeTrees          int
	addsDone, deletesDone       int
	marks                       int
	main                        *branch
	topics                      []*branch // open topics
	merged                      []*branch
	releases                    []*branch
	nextTagAt                   float64
	tagEvery                    float64
	lineSeq                     uint64
	topicSeq                    int
	buf, msg                    []byte
	people                      []person
	peopleWeight                fenwick
	progress                    io.Writer
	started                     time.Time
	nextReport                  int
	meanWeight                  float64
	mainWhen                    int64 // commit time of main's tip
	pulls                       pullRequests
}

func newGenerator(sh *shape, t targets, seed int64, pullRefs int, w *bufio.Writer, progress io.Writer) *generator {
	var nameSeed uint64
	for _, c := range sh.name {
		nameSeed = nameSeed*131 + uint64(c)
	}
	g := &generator{
		sh: sh, t: t, out: w, progress: progress,
		rng:       rand.New(rand.NewPCG(uint64(seed), nameSeed)),
		cat:       newCatalog(sh, t.files),
		seenTrees: objectSet{}, seenBlobs: objectSet{},
		started: time.Now(),
		pulls:   newPullRequests(pullRefs, seed, nameSeed),
	}
	g.tagEvery = float64(t.commits) / float64(t.mainTags+1)
	g.nextTagAt = g.tagEvery
	first := []string{"Ada", "Brian", "Chen", "Dana", "Emil", "Fatima", "Greg", "Hana", "Ivan", "Julia", "Kofi", "Lena",
		"Mateo", "Nadia", "Oskar", "Priya", "Quinn", "Rosa", "Sven", "Tomoko", "Uma", "Viktor", "Wen", "Yusuf", "Zoe"}
	last := []string{"Abbott", "Berg", "Costa", "Dubois", "Eklund", "Fischer", "Garcia", "Horvat", "Ito", "Jensen",
		"Kowalski", "Larsen", "Moreau", "Novak", "Okafor", "Petrov", "Rossi", "Sato", "Tanaka", "Varga", "Weber"}
	zones := []string{"+0000", "-0800", "-0500", "+0100", "+0200", "+0530", "+0900", "-0300"}
	for i := range 60 {
		f, l := first[g.rng.IntN(len(first))], last[g.rng.IntN(len(last))]
		g.people = append(g.people, person{
			ident: fmt.Sprintf("%s %s <%s.%s@example.org>", f, l, lowerASCII(f), lowerASCII(l)),
			tz:    zones[g.rng.IntN(len(zones))],
		})
		g.peopleWeight.append(1 / float64(i+1)) // a few people write most commits
	}
	// Mean popularity of a file, to size the shares of the root files.
	var wsum, hot float64
	for _, a := range sh.areas {
		wsum += a.weight
		hot += a.weight * a.hot
	}
	g.meanWeight = hot / wsum * math.Exp(popularitySigma*popularitySigma/2)
	return g
}

// popularitySigma spreads how often files change: log-normal, so a few
// files take many of the changes.
const popularitySigma = 1.3

func lowerASCII(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

func (g *generator) nextLine() uint32 {
	g.lineSeq++
	return uint32(mix64(g.lineSeq * 0x9e3779b97f4a7c15))
}

// run writes the whole stream.
func (g *generator) run(ctx context.Context) error {
	fmt.Fprintf(g.out, "feature done\n")
	g.main = &branch{ref: "refs/heads/main", root: &node{mode: modeDir, open: true}}
	g.initialCommit()
	releaseAt := make([]int, g.t.releases)
	for r := range releaseAt {
		releaseAt[r] = int(float64(g.t.commits) * (0.4 + 0.55*float64(r)/float64(g.t.releases)))
	}
	for g.commits < g.t.commits {
		if g.commits%256 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if len(g.releases) < len(releaseAt) && g.commits >= releaseAt[len(g.releases)] {
			g.forkRelease()
		}
		g.step()
		g.openDue()
		g.report(false)
		if len(g.pending) >= chunkBlobs || g.pendingBytes >= chunkBytes {
			g.flushChunk()
		}
	}
	g.finishTopics()
	g.openDue()
	g.flushChunk()
	fmt.Fprintf(g.out, "done\n")
	g.report(true)
	return g.out.Flush()
}

// Bounds of a chunk of history held back to group its blobs: larger
// chunks give more versions of a file together (more deltas) and take
// more memory.
var (
	chunkBlobs = 8192
	chunkBytes = 64 << 20
)

type pendingBlob struct {
	path string
	seq  int
	mark int
	data []byte
}

// flushChunk writes the chunk's blobs, grouped by path (oldest version
// first), then its commits, tags and resets, which name the blobs by mark.
func (g *generator) flushChunk() {
	slices.SortFunc(g.pending, func(a, b pendingBlob) int {
		if c := strings.Compare(a.path, b.path); c != 0 {
			return c
		}
		return a.seq - b.seq
	})
	for _, b := range g.pending {
		fmt.Fprintf(g.out, "blob\nmark :%d\ndata %d\n", b.mark, len(b.data))
		g.out.Write(b.data)
		g.out.WriteByte('\n')
	}
	g.out.Write(g.w.Bytes())
	g.w.Reset()
	clear(g.pending)
	g.pending = g.pending[:0]
	g.pendingBytes = 0
}

func (g *generator) report(final bool) {
	if g.progress == nil || (!final && g.commits < g.nextReport) {
		return
	}
	g.nextReport = g.commits + max(1, g.t.commits/10)
	fmt.Fprintf(g.progress, "synth %s: %d/%d commits, %d trees, %d blobs written (%s)\n",
		g.sh.name, g.commits, g.t.commits, g.trees, g.blobs, time.Since(g.started).Round(time.Millisecond))
}

// step writes one commit: a merge, a topic commit, a backport on a release
// branch or a commit on main, in the shape's proportions.
func (g *generator) step() {
	fm := g.sh.mergeFraction
	ft := fm * g.sh.topicLength
	fr := g.sh.releaseCommitFraction / 0.6 // release branches exist for the last ~60% of history
	r := g.rng.Float64()
	switch {
	case r < fm:
		if t := g.readyTopic(); t != nil {
			g.merge(t)
			return
		}
		g.topicCommit()
	case r < fm+ft:
		g.topicCommit()
	case r < fm+ft+fr && len(g.releases) > 0:
		g.releaseCommit()
	default:
		g.mainCommit()
	}
}

func (g *generator) readyTopic() *branch {
	for _, t := range g.topics {
		if t.done >= t.planned {
			return t
		}
	}
	return nil
}

// plan decides how many files a commit changes from the blobs still to
// write per commit still to come: most commits touch one to five files,
// a few touch many.
func (g *generator) plan() (k int, mu float64) {
	remB := float64(g.t.blobs - g.blobs)
	remC := float64(g.t.commits - g.commits)
	mu = remB / max(1, remC*(1-g.sh.mergeFraction))
	const tail, tailMean = 0.03, 23.0
	body := (mu - tail*tailMean) / (1 - tail)
	switch {
	case mu <= 1:
		k = 1
	case body < 1.05:
		k = 1 + geometric(g.rng, mu-1)
	case g.rng.Float64() < tail:
		k = 6 + g.rng.IntN(35)
	default:
		k = 1 + geometric(g.rng, body-1)
	}
	return max(1, min(k, int(remB))), mu
}

// geometric draws a count >= 0 with the given mean.
func geometric(rng *rand.Rand, mean float64) int {
	if mean <= 0 {
		return 0
	}
	p := 1 / (1 + mean)
	n := 0
	for rng.Float64() > p && n < 500 {
		n++
	}
	return n
}

// stochastic rounds x up or down with the odds of its fraction.
func (g *generator) stochastic(x float64) int {
	if x <= 0 {
		return 0
	}
	n := int(x)
	if g.rng.Float64() < x-float64(n) {
		n++
	}
	return n
}

// desiredTrees is how many new trees a commit changing k files should make
// so that the history ends near the shape's tree count.
func (g *generator) desiredTrees(k int, mu float64) int {
	remC := float64(g.t.commits - g.commits)
	remMerges := remC * g.sh.mergeFraction
	perMerge := 3.0
	if g.merges > 0 {
		perMerge = float64(g.mergeTrees) / float64(g.merges)
	}
	nonMerge := max(1, remC-remMerges)
	perCommit := (float64(g.t.trees-g.trees) - remMerges*perMerge) / nonMerge
	return max(1, g.stochastic(perCommit*float64(k)/max(mu, 1)))
}

// choose picks k files for a commit on b, among a few candidate sets (all
// near one popular file, within its area, or independent) the one whose
// new trees come closest to desired. area >= 0 keeps to one area (topics).
func (g *generator) choose(b *branch, k, area, desired int, base []*dirRec) []*fileRec {
	exists := func(f *fileRec) bool {
		return f.alive && f.mode != modeLink && (b == g.main || lookup(b.root, f.parts) != nil)
	}
	var best []*fileRec
	bestDiff := math.MaxInt
	for c := range 6 {
		set := g.candidate(k, area, c, exists)
		if len(set) == 0 {
			continue
		}
		diff := abs(countDirs(base, set) - desired)
		if diff < bestDiff {
			best, bestDiff = set, diff
		}
	}
	return best
}

// candidate draws k files around a popular one: the nearest in the tree
// (strategies 0-3), anywhere in its area (4), or independently (5).
func (g *generator) candidate(k, area, strategy int, exists func(*fileRec) bool) []*fileRec {
	focus := g.cat.popular(g.rng, area, exists)
	if focus == nil {
		return nil
	}
	set := []*fileRec{focus}
	taken := map[*fileRec]bool{focus: true}
	free := func(f *fileRec) bool { return f != nil && !taken[f] && exists(f) }
	near := focus.dir
	for tries := 0; len(set) < k && tries < 6*k+8; tries++ {
		var f *fileRec
		switch strategy {
		case 0, 1, 2, 3:
			f = g.cat.under(g.rng, near)
			if (f == nil || !free(f)) && tries%3 == 2 && near.parent != nil {
				near = near.parent // this directory has nothing more: widen
			}
		case 4:
			f = g.cat.popular(g.rng, focus.area, free)
		default:
			f = g.cat.popular(g.rng, area, free)
		}
		if free(f) {
			set = append(set, f)
			taken[f] = true
		}
	}
	return set
}

// countDirs is the number of directories (the root included) on the paths
// of the files and of base: the trees a commit changing them writes.
func countDirs(base []*dirRec, files []*fileRec) int {
	seen := map[*dirRec]bool{}
	n := 0
	mark := func(d *dirRec) {
		for ; d != nil && !seen[d]; d = d.parent {
			seen[d] = true
			n++
		}
	}
	for _, d := range base {
		mark(d)
	}
	for _, f := range files {
		mark(f.dir)
	}
	return n
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// initialCommit writes main's first commit: the root files and a first
// share of the tree.
func (g *generator) initialCommit() {
	sh := g.sh
	g.beginCommit(g.main, nil, "Initial commit", "")
	nRoot := min(len(sh.rootFiles), max(2, g.t.files/10), g.t.initial)
	sharesTotal := 0.0
	for _, rf := range sh.rootFiles[:nRoot] {
		sharesTotal += rf.share
	}
	expectedTotal := float64(g.t.files) * g.meanWeight / max(0.5, 1-sharesTotal)
	for _, rf := range sh.rootFiles[:nRoot] {
		lang := languages[rf.lang]
		f := g.cat.add(g.cat.root, rf.name, -1, lang, rf.size, modeFile, rf.share*expectedTotal)
		g.writeNew(g.main, f)
	}
	for range g.t.initial - nRoot {
		a := g.pickArea()
		g.addFile(g.main, a, g.cat.place(g.rng, a), false)
	}
	g.endCommit(g.main)
}

func (g *generator) pickArea() int {
	total := 0.0
	for _, a := range g.sh.areas {
		total += a.weight
	}
	u := g.rng.Float64() * total
	for i, a := range g.sh.areas {
		if u -= a.weight; u < 0 {
			return i
		}
	}
	return len(g.sh.areas) - 1
}

// addFile creates a new file in directory d of area a on b (main).
func (g *generator) addFile(b *branch, a int, d *dirRec, mayLink bool) *fileRec {
	ar := &g.sh.areas[a]
	if mayLink && g.rng.Float64() < g.sh.symlinkFraction && len(d.files) > 0 {
		target := d.files[g.rng.IntN(len(d.files))]
		name := g.cat.fileName(g.rng, d, target.lang)
		f := g.cat.add(d, name, a, target.lang, 0, modeLink, 0)
		f.link = target.parts[len(target.parts)-1]
		g.writeNew(b, f)
		return f
	}
	lang := languages[pick(g.rng, ar.langs)]
	size := logNormal(g.rng, float64(ar.sizeMedian), ar.sizeSigma)
	weight := ar.hot * math.Exp(popularitySigma*g.rng.NormFloat64())
	if g.rng.Float64() < ar.bigChance {
		size = 100_000 * math.Pow(10, g.rng.Float64()) // 100 KB to 1 MB, rarely changed
		weight *= 0.15
	}
	mode := uint32(modeFile)
	if lang.exec {
		mode = modeExec
	}
	f := g.cat.add(d, g.cat.fileName(g.rng, d, lang), a, lang, int(min(max(size, 60), 2e6)), mode, weight)
	g.writeNew(b, f)
	return f
}

func pick(rng *rand.Rand, ws []weighted) string {
	total := 0.0
	for _, w := range ws {
		total += w.weight
	}
	u := rng.Float64() * total
	for _, w := range ws {
		if u -= w.weight; u < 0 {
			return w.name
		}
	}
	return ws[len(ws)-1].name
}

// writeNew writes the first version of f on b.
func (g *generator) writeNew(b *branch, f *fileRec) {
	n := &node{name: f.parts[len(f.parts)-1], mode: f.mode}
	if f.mode == modeLink {
		g.buf = append(g.buf[:0], f.link...)
	} else {
		n.text = newText(f.lang, f.size, g.rng, g.nextLine)
		g.buf = n.text.render(g.buf[:0])
	}
	g.putBlob(b, f, n)
}

// modify writes a new version of f on b.
func (g *generator) modify(b *branch, f *fileRec) bool {
	old := lookup(b.root, f.parts)
	if old == nil || old.text == nil {
		return false
	}
	n := &node{name: old.name, mode: old.mode}
	for try := 0; try < 4; try++ {
		n.text = old.text.edit(g.rng, g.nextLine)
		g.buf = n.text.render(g.buf[:0])
		if objectID("blob", g.buf) != old.oid {
			break
		}
	}
	g.putBlob(b, f, n)
	return true
}

func (g *generator) putBlob(b *branch, f *fileRec, n *node) {
	n.size = len(g.buf)
	n.oid = objectID("blob", g.buf)
	b.root = setPath(b.root, f.parts, n)
	g.marks++
	g.pending = append(g.pending, pendingBlob{path: f.path, seq: len(g.pending), mark: g.marks, data: bytes.Clone(g.buf)})
	g.pendingBytes += len(g.buf)
	fmt.Fprintf(&g.w, "M %o :%d %s\n", n.mode, g.marks, f.path)
	if g.seenBlobs.add(n.oid) {
		g.blobs++
	}
}

func (g *generator) deleteFile(b *branch, f *fileRec) {
	fmt.Fprintf(&g.w, "D %s\n", f.path)
	if root := deletePath(b.root, f.parts); root != nil {
		b.root = root
	}
	g.cat.remove(f)
}

// beginCommit writes a commit's header; file changes follow.
func (g *generator) beginCommit(b *branch, parents []int, subject, body string) {
	g.marks++
	g.commits++
	span := g.sh.end.Sub(g.sh.start).Seconds()
	step := span / float64(g.t.commits)
	when := g.sh.start.Unix() + int64(step*float64(g.commits-1)+g.rng.Float64()*step*0.9)
	p := g.people[g.peopleWeight.sample(g.rng)]
	committer := p
	if g.sh.signedOff && g.rng.IntN(4) > 0 {
		committer = g.people[g.rng.IntN(4)] // maintainers commit others' patches
	}
	g.msg = append(g.msg[:0], subject...)
	g.msg = append(g.msg, '\n')
	if body != "" {
		g.msg = append(g.msg, '\n')
		g.msg = append(g.msg, body...)
	}
	if g.sh.signedOff && len(parents) < 2 {
		g.msg = append(g.msg, "\nSigned-off-by: "...)
		g.msg = append(g.msg, p.ident...)
		g.msg = append(g.msg, '\n')
		if committer != p {
			g.msg = append(g.msg, "Signed-off-by: "...)
			g.msg = append(g.msg, committer.ident...)
			g.msg = append(g.msg, '\n')
		}
	}
	if b == g.main {
		g.mainWhen = when
	}
	fmt.Fprintf(&g.w, "commit %s\nmark :%d\nauthor %s %d %s\ncommitter %s %d %s\ndata %d\n%s",
		b.ref, g.marks, p.ident, when, p.tz, committer.ident, when, committer.tz, len(g.msg), g.msg)
	for i, m := range parents {
		if i == 0 {
			fmt.Fprintf(&g.w, "from :%d\n", m)
		} else {
			fmt.Fprintf(&g.w, "merge :%d\n", m)
		}
	}
	b.tip = g.marks
}

// endCommit ends the commit and counts the trees it created.
func (g *generator) endCommit(b *branch) int {
	g.w.WriteByte('\n')
	n := g.hash.seal(b.root, g.seenTrees)
	g.trees += n
	return n
}

// subject makes up a commit subject (and a body) in the project's style.
func (g *generator) subject(f *fileRec) (string, string) {
	verbs := []string{"Fix", "Add", "Remove", "Update", "Use", "Avoid", "Handle", "Simplify", "Clean up", "Move", "Rename", "Support"}
	s := verbs[g.rng.IntN(len(verbs))] + " " + words[g.rng.IntN(len(words)-20)] + " " + words[g.rng.IntN(len(words)-20)]
	for range g.rng.IntN(4) {
		s += " " + words[g.rng.IntN(len(words))]
	}
	if g.sh.subjectPrefix && f != nil && len(f.parts) > 1 {
		prefix := f.parts[0]
		if len(f.parts) > 2 {
			prefix = f.parts[len(f.parts)-2]
		}
		s = prefix + ": " + lowerASCII(s[:1]) + s[1:]
	}
	var body []byte
	for range g.rng.IntN(6) {
		for j := range 6 + g.rng.IntN(8) {
			if j > 0 {
				body = append(body, ' ')
			}
			body = append(body, words[g.rng.IntN(len(words))]...)
		}
		body = append(body, '\n')
	}
	var trailer string
	switch {
	case g.sh.name == "jquery" && g.rng.IntN(3) == 0:
		trailer = "Fixes gh-" + strconv.Itoa(100+g.rng.IntN(4900)) + "\n"
	case g.sh.name == "swift" && g.rng.IntN(4) == 0:
		trailer = "rdar://problem/" + strconv.Itoa(10_000_000+g.rng.IntN(60_000_000)) + "\n"
	}
	if trailer != "" && len(body) > 0 {
		body = append(body, '\n')
	}
	return s, string(body) + trailer
}

// mainCommit changes, adds and now and then deletes files on main.
func (g *generator) mainCommit() {
	k, mu := g.plan()
	remC := float64(g.t.commits - g.commits)
	mainShare := max(0.05, 1-g.sh.mergeFraction*(1+g.sh.topicLength)-g.sh.releaseCommitFraction)
	adds := g.stochastic(float64(g.t.adds-g.addsDone) / max(1, remC*mainShare))
	deletes := g.stochastic(float64(g.t.deletes-g.deletesDone) / max(1, remC*mainShare))
	desired := g.desiredTrees(max(k, adds), mu)
	var focus *fileRec
	// Place the new files first: their directories count among the trees.
	var addDirs []*dirRec
	var addAreas []int
	for range adds {
		a := g.pickArea()
		addAreas = append(addAreas, a)
		addDirs = append(addDirs, g.cat.place(g.rng, a))
	}
	files := g.choose(g.main, k-adds, -1, desired, addDirs)
	if len(files) > 0 {
		focus = files[0]
	}
	subject, body := g.subject(focus)
	g.beginCommit(g.main, []int{g.main.tip}, subject, body)
	for _, f := range files {
		g.modify(g.main, f)
	}
	for i, a := range addAreas {
		g.addFile(g.main, a, addDirs[i], true)
		g.addsDone++
	}
	for range deletes {
		f := g.cat.popular(g.rng, -1, func(f *fileRec) bool { return f.area >= 0 && f.alive && !contains(files, f) })
		if f != nil && g.cat.alive > 3 {
			g.deleteFile(g.main, f)
			g.deletesDone++
		}
	}
	g.endCommit(g.main)
	g.maybeTagMain()
}

func contains(files []*fileRec, f *fileRec) bool {
	for _, x := range files {
		if x == f {
			return true
		}
	}
	return false
}

func (g *generator) maybeTagMain() {
	if float64(g.commits) < g.nextTagAt || g.mainTagCount() >= g.t.mainTags {
		return
	}
	g.nextTagAt += g.tagEvery
	g.tag(g.sh.mainTag(g.mainTagCount()), g.main.tip)
}

func (g *generator) mainTagCount() int {
	n := g.tags
	for _, r := range g.releases {
		n -= r.tagged
	}
	return n
}

func (g *generator) tag(name string, mark int) {
	g.tags++
	p := g.people[g.rng.IntN(3)]
	msg := "Release " + name + "\n"
	fmt.Fprintf(&g.w, "tag %s\nfrom :%d\ntagger %s %d %s\ndata %d\n%s\n", name, mark, p.ident,
		g.sh.start.Unix()+int64(float64(g.commits)/float64(g.t.commits)*g.sh.end.Sub(g.sh.start).Seconds()), p.tz, len(msg), msg)
}

// topicCommit writes a commit on an open topic branch, or opens one.
func (g *generator) topicCommit() {
	var open []*branch
	for _, t := range g.topics {
		if t.done < t.planned {
			open = append(open, t)
		}
	}
	var t *branch
	switch {
	case len(open) == 0 || (len(g.topics) < g.sh.maxTopics && g.rng.Float64() < 1/g.sh.topicLength):
		if len(g.topics) >= g.sh.maxTopics {
			if ready := g.readyTopic(); ready != nil {
				g.merge(ready)
				return
			}
		}
		g.topicSeq++
		focus := g.cat.popular(g.rng, -1, func(f *fileRec) bool { return f.area >= 0 })
		area := 0
		if focus != nil {
			area = focus.area
		}
		name := fmt.Sprintf("topic/%s-%s-%d", words[g.rng.IntN(len(words)-20)], words[g.rng.IntN(len(words)-20)], g.topicSeq)
		t = &branch{ref: "refs/heads/" + name, root: g.main.root, tip: g.main.tip, area: area,
			planned: 1 + geometric(g.rng, g.sh.topicLength-1), changedSet: map[*fileRec]bool{}}
		g.topics = append(g.topics, t)
	default:
		t = open[g.rng.IntN(len(open))]
	}
	k, mu := g.plan()
	files := g.choose(t, k, t.area, g.desiredTrees(k, mu), nil)
	if len(files) == 0 {
		files = g.choose(t, k, -1, g.desiredTrees(k, mu), nil)
	}
	var focus *fileRec
	if len(files) > 0 {
		focus = files[0]
	}
	subject, body := g.subject(focus)
	g.beginCommit(t, []int{t.tip}, subject, body)
	for _, f := range files {
		if g.modify(t, f) && !t.changedSet[f] {
			t.changedSet[f] = true
			t.changed = append(t.changed, f)
		}
	}
	g.endCommit(t)
	t.done++
}

// merge merges topic t into main: main's tree with the topic's versions of
// the files it changed (the topic wins where both changed a file).
func (g *generator) merge(t *branch) {
	name := t.ref[len("refs/heads/"):]
	g.beginCommit(g.main, []int{g.main.tip, t.tip}, "Merge branch '"+name+"'", "")
	for _, f := range t.changed {
		n := lookup(t.root, f.parts)
		if n == nil || !f.alive {
			continue
		}
		g.main.root = setPath(g.main.root, f.parts, n)
		fmt.Fprintf(&g.w, "M %o %s %s\n", n.mode, hex.EncodeToString(n.oid[:]), f.path)
	}
	g.mergeTrees += g.endCommit(g.main)
	g.merges++
	for i, x := range g.topics {
		if x == t {
			g.topics = append(g.topics[:i], g.topics[i+1:]...)
			break
		}
	}
	g.merged = append(g.merged, t)
	g.maybeTagMain()
}

// forkRelease opens a release branch at main's tip.
func (g *generator) forkRelease() {
	r := &branch{ref: "refs/heads/" + g.sh.releaseBranch(len(g.releases)), root: g.main.root, tip: g.main.tip, index: len(g.releases)}
	g.releases = append(g.releases, r)
	fmt.Fprintf(&g.w, "reset %s\nfrom :%d\n\n", r.ref, r.tip)
}

// releaseCommit writes a backport (one or two files) on a release branch,
// mostly the newest, and now and then tags a point release.
func (g *generator) releaseCommit() {
	r := g.releases[len(g.releases)-1]
	if len(g.releases) > 1 && g.rng.Float64() < 0.3 {
		r = g.releases[g.rng.IntN(len(g.releases))]
	}
	k := 1 + g.rng.IntN(2)
	files := g.choose(r, k, -1, k+2, nil)
	if len(files) == 0 {
		g.mainCommit()
		return
	}
	subject, body := g.subject(files[0])
	g.beginCommit(r, []int{r.tip}, "[backport] "+subject, body)
	for _, f := range files {
		g.modify(r, f)
	}
	g.endCommit(r)
	if g.rng.Float64() < 0.15 {
		g.tag(g.sh.releaseTag(r.index, r.tagged), r.tip)
		r.tagged++
	}
}

// finishTopics leaves open topics as branches, and the last few merged
// ones; the other merged topic branches are deleted, as after a pull
// request.
func (g *generator) finishTopics() {
	keep := int(math.Ceil(float64(g.sh.keepMerged) * float64(g.t.commits) / float64(g.sh.commits)))
	for i, t := range g.merged {
		if i < len(g.merged)-keep {
			fmt.Fprintf(&g.w, "reset %s\n\n", t.ref)
		}
	}
}
