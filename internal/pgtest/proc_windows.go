package pgtest

import "os/exec"

// PostgreSQL's tests run on Linux and macOS (as serve does); on Windows
// these only let the package build.
type credential struct{ uid, gid uint32 }

func runAs(*exec.Cmd, *credential, bool) {}

func interrupt(cmd *exec.Cmd) { cmd.Process.Kill() }

func killGroup(cmd *exec.Cmd) { cmd.Process.Kill() }
