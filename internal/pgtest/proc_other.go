//go:build !linux && !windows

package pgtest

import "syscall"

func setParentDeath(*syscall.SysProcAttr) {}
