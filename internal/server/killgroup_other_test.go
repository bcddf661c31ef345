//go:build !unix

package server

import "os"

// killGroup kills the process itself: there are no process groups here
// (and serve refuses to run, see CheckPlatform).
func killGroup(pid int) {
	if p, err := os.FindProcess(pid); err == nil {
		p.Kill()
	}
}
