// Package procgroup starts the git processes packwire runs so that each one
// and everything it starts (pack-objects, hooks) can be killed at once, and
// reads what a finished process cost. The calls differ per OS: Linux also
// ties the child's life to packwire's (Pdeathsig); macOS and the BSDs have
// process groups but no Pdeathsig; Windows has neither, so there a kill
// reaches the process itself only (KillsWholeTree is false) and `serve`
// refuses to run.
package procgroup

import "time"

// Usage is what a finished process cost.
type Usage struct {
	UserCPU time.Duration
	SysCPU  time.Duration
	MaxRSS  int64 // bytes, largest process in the tree; 0 where the OS does not say
}
