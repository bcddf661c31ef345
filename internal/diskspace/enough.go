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
