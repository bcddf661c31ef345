package procgroup

import (
	"context"
	"os/exec"
)

// Run starts cmd in a process group of its own (Start) and waits for it;
// if ctx ends first, the whole group is killed, git's children included.
func Run(ctx context.Context, cmd *exec.Cmd) error {
	if err := Start(cmd); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { Kill(cmd) })
	err := cmd.Wait()
	stop()
	return err
}
