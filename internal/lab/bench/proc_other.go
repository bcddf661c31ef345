//go:build !unix

package bench

import "os/exec"

// setProcessGroup is a no-op where process groups are not available: a
// cancelled operation kills git itself (exec's default).
func setProcessGroup(cmd *exec.Cmd) {}
