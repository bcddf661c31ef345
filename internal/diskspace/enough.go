package diskspace

// Enough reports whether dir's file system has at least min bytes free.
// min <= 0 is no bound; a system where Free cannot tell (-1) does not
// apply it; an error reading the free space counts as not enough.
func Enough(dir string, min int64) bool {
	if min <= 0 {
		return true
	}
	free, err := Free(dir)
	return err == nil && (free < 0 || free >= min)
}

// Bound is a free-space bound that remembers its last answer, so that a
// caller can log when the answer changes rather than on every check. It is
// not safe for concurrent use: its owner's lock guards it.
type Bound struct {
	low bool
}

// Check reports whether dir has min bytes free (see Enough), and whether
// that answer differs from the previous Check's.
func (b *Bound) Check(dir string, min int64) (enough, changed bool) {
	enough = Enough(dir, min)
	changed = enough == b.low
	b.low = !enough
	return enough, changed
}
