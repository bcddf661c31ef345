package server

import (
	"errors"

	"packwire/internal/procgroup"
)

// CheckPlatform refuses an OS where a request's git cannot be killed with
// everything it started (pack-objects under upload-pack): a client that
// hangs up would leave pack generation running, so serving there would
// only half work.
func CheckPlatform() error {
	if procgroup.KillsWholeTree {
		return nil
	}
	return errors.New("packwire serve runs on Linux and macOS; on Windows use the lab commands: bench, synth, sizer, netem, rtt, compare, advise")
}
