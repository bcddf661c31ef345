//go:build unix

package server

import "syscall"

// killGroup kills the process group a spawned git leads (gitexec starts
// each in its own), pack-objects and hooks included.
func killGroup(pid int) { syscall.Kill(-pid, syscall.SIGKILL) }
