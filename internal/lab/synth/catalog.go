package synth

import (
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
)

// catalog is the file and directory layout of main: where files are, how
// popular each is (some files change far more often than others), and the
// placement of new files. Branches keep their own trees (node); the
// catalog is only used to choose what a commit touches.
type catalog struct {
	sh     *shape
	alpha  float64 // scales the areas' alpha: small repositories have fewer, fuller directories
	root   *dirRec
	areas  []*dirRec // area directories, created with their first file
	files  []*fileRec
	byPath map[string]*fileRec
	pop    fenwick // popularity of each file by id (0 once deleted, and for symlinks)
	alive  int
}

// identStyle is how a project names things: camelCase (JavaScript, Swift)
// or snake_case (C).
type identStyle int

const (
	camelCase identStyle = iota
	snakeCase
)

type dirRec struct {
	parts   []string
	area    int // index in shape.areas, -1 for the root
	level   int // depth below the area's directory
	parent  *dirRec
	subdirs []*dirRec
	files   []*fileRec // alive files, oldest first
	under   int        // alive files in this subtree
	names   map[string]bool
}

type fileRec struct {
	id     int
	parts  []string
	path   string
	dir    *dirRec
	area   int
	lang   *language
	size   int
	mode   uint32
	link   string // symlink target
	weight float64
	alive  bool
}

func newCatalog(sh *shape, files int) *catalog {
	return &catalog{
		sh:     sh,
		alpha:  min(1, math.Pow(float64(files)/float64(sh.files), 0.3)),
		root:   &dirRec{area: -1, names: map[string]bool{}},
		areas:  make([]*dirRec, len(sh.areas)),
		byPath: map[string]*fileRec{},
	}
}

// areaDir returns the directory of area a, creating it.
func (c *catalog) areaDir(a int) *dirRec {
	if c.areas[a] == nil {
		c.areas[a] = c.root
		if p := c.sh.areas[a].path; p != "" {
			c.areas[a] = c.subdir(c.root, p, a, 0)
		}
	}
	return c.areas[a]
}

func (c *catalog) subdir(parent *dirRec, name string, area, level int) *dirRec {
	d := &dirRec{parts: append(slices.Clone(parent.parts), name), area: area, level: level, parent: parent, names: map[string]bool{}}
	parent.names[name] = true
	parent.subdirs = append(parent.subdirs, d)
	return d
}

// place picks the directory of a new file of area a: a random walk from the
// area's directory (see area).
func (c *catalog) place(rng *rand.Rand, a int) *dirRec {
	ar := &c.sh.areas[a]
	d := c.areaDir(a)
	for level := 0; ; level++ {
		if level >= ar.minDepth && (level >= ar.maxDepth || rng.Float64() < ar.stop) {
			return d
		}
		total := ar.alpha * c.alpha
		for _, s := range d.subdirs {
			total += float64(s.under + 1)
		}
		u := rng.Float64() * total
		var next *dirRec
		for _, s := range d.subdirs {
			if u -= float64(s.under + 1); u < 0 {
				next = s
				break
			}
		}
		if next == nil {
			next = c.subdir(d, c.dirName(rng, d, ar, level), a, level+1)
		}
		d = next
	}
}

// dirName names a new directory below d: first from the area's list for
// that level, then made up in the project's style.
func (c *catalog) dirName(rng *rand.Rand, d *dirRec, ar *area, level int) string {
	if level < len(ar.levels) {
		var free []string
		for _, n := range ar.levels[level] {
			if !d.names[n] {
				free = append(free, n)
			}
		}
		if len(free) > 0 {
			return free[rng.IntN(len(free))]
		}
	}
	for i := 0; ; i++ {
		w := words[rng.IntN(len(words)-20)]
		var name string
		switch {
		case c.sh.identStyle == snakeCase && rng.IntN(3) == 0:
			name = w + strconv.Itoa(rng.IntN(9000)+100)
		case c.sh.identStyle == snakeCase:
			name = w
		case c.sh.name == "swift":
			name = upperFirst(w) + upperFirst(words[rng.IntN(len(words)-20)])
		default:
			name = w
		}
		if i > 5 {
			name += strconv.Itoa(i)
		}
		if !d.names[name] {
			return name
		}
	}
}

// fileName names a new file of language lang in d.
func (c *catalog) fileName(rng *rand.Rand, d *dirRec, lang *language) string {
	for i := 0; ; i++ {
		a, b := words[rng.IntN(len(words)-20)], words[rng.IntN(len(words)-20)]
		var base string
		switch {
		case lang == languages["make"]:
			base = "Makefile"
			if i > 0 {
				base = "Makefile." + a
			}
		case lang == languages["kconfig"]:
			base = "Kconfig"
			if i > 0 {
				base = "Kconfig." + a
			}
		case lang.snake:
			base = a + "_" + b
			if rng.IntN(3) == 0 {
				base = a
			}
		case lang == languages["cpp"] || lang == languages["h"] || lang == languages["swift"] || lang == languages["def"]:
			base = upperFirst(a) + upperFirst(b)
		case lang == languages["md"] || lang == languages["rst"] || lang == languages["txt"]:
			base = a + "-" + b
		default:
			base = a + upperFirst(b)
		}
		if i > 3 {
			base += strconv.Itoa(i)
		}
		name := base + lang.ext
		if lang == languages["cmake"] {
			name = "CMakeLists.txt"
			if i > 0 {
				name = a + upperFirst(b) + ".cmake"
			}
		}
		if !d.names[name] {
			return name
		}
	}
}

// add registers a new file.
func (c *catalog) add(d *dirRec, name string, area int, lang *language, size int, mode uint32, weight float64) *fileRec {
	parts := append(slices.Clone(d.parts), name)
	f := &fileRec{id: len(c.files), parts: parts, path: strings.Join(parts, "/"), dir: d, area: area,
		lang: lang, size: size, mode: mode, weight: weight, alive: true}
	d.names[name] = true
	d.files = append(d.files, f)
	for p := d; p != nil; p = p.parent {
		p.under++
	}
	c.files = append(c.files, f)
	c.byPath[f.path] = f
	c.pop.append(weight)
	c.alive++
	return f
}

// remove unregisters a deleted file (its name stays taken).
func (c *catalog) remove(f *fileRec) {
	f.alive = false
	if i := slices.Index(f.dir.files, f); i >= 0 {
		f.dir.files = slices.Delete(f.dir.files, i, i+1)
	}
	for p := f.dir; p != nil; p = p.parent {
		p.under--
	}
	delete(c.byPath, f.path)
	c.pop.set(f.id, 0)
	c.alive--
}

// popular picks a file by popularity; within area a when a >= 0 (falling
// back to any file when the area has none popular enough to be found).
func (c *catalog) popular(rng *rand.Rand, a int, ok func(*fileRec) bool) *fileRec {
	for try := 0; try < 40; try++ {
		f := c.files[c.pop.sample(rng)]
		if (a < 0 || f.area == a || try >= 30) && ok(f) {
			return f
		}
	}
	return nil
}

// under picks a file in d's subtree, each with the same chance.
func (c *catalog) under(rng *rand.Rand, d *dirRec) *fileRec {
	for d.under > 0 {
		u := rng.IntN(d.under)
		if u < len(d.files) {
			return d.files[u]
		}
		u -= len(d.files)
		next := d
		for _, s := range d.subdirs {
			if u < s.under {
				next = s
				break
			}
			u -= s.under
		}
		if next == d {
			return nil
		}
		d = next
	}
	return nil
}

// fenwick is a binary indexed tree of weights: sampling and updates in
// O(log n) over tens of thousands of files.
type fenwick struct {
	tree []float64 // 1-based partial sums
	w    []float64
}

func (f *fenwick) append(w float64) {
	f.w = append(f.w, 0)
	i := len(f.w)
	// The new node covers (i - lowbit(i), i]: sum of the earlier weights it covers.
	sum := 0.0
	for j := i - 1; j > i-(i&-i); j -= j & -j {
		sum += f.tree[j-1]
	}
	f.tree = append(f.tree, sum)
	f.set(i-1, w)
}

func (f *fenwick) set(i int, w float64) {
	d := w - f.w[i]
	f.w[i] = w
	for j := i + 1; j <= len(f.tree); j += j & -j {
		f.tree[j-1] += d
	}
}

func (f *fenwick) total() float64 {
	s := 0.0
	for j := len(f.tree); j > 0; j -= j & -j {
		s += f.tree[j-1]
	}
	return s
}

// sample returns an index with probability proportional to its weight.
func (f *fenwick) sample(rng *rand.Rand) int {
	u := rng.Float64() * f.total()
	pos := 0
	for step := 1 << bitsLen(len(f.tree)); step > 0; step >>= 1 {
		if next := pos + step; next <= len(f.tree) && f.tree[next-1] <= u {
			pos = next
			u -= f.tree[next-1]
		}
	}
	for pos < len(f.w) && f.w[pos] == 0 { // rounding at the very end
		pos++
	}
	return min(pos, len(f.w)-1)
}

func bitsLen(n int) int {
	b := 0
	for n > 1 {
		n >>= 1
		b++
	}
	return b
}

// logNormal draws a log-normally distributed value with the given median.
func logNormal(rng *rand.Rand, median, sigma float64) float64 {
	return median * math.Exp(sigma*rng.NormFloat64())
}
