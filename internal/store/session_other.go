//go:build !linux

package store

import "syscall"

// setUserTimeout: TCP_USER_TIMEOUT is Linux's; elsewhere keepalives alone.
func setUserTimeout(string, string, syscall.RawConn) error { return nil }
