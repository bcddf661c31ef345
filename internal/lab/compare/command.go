package compare

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// Command returns a run function for Run that executes argv directly (no
// shell: the arguments are passed as given), discards its output, and
// times it from start to exit. A non-zero exit is an error carrying the
// end of what the command wrote to stderr.
func Command(argv []string) (func(context.Context) (time.Duration, error), error) {
	if len(argv) == 0 {
		return nil, errors.New("empty command")
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return nil, fmt.Errorf("command %q: %w", argv[0], err)
	}
	return func(ctx context.Context) (time.Duration, error) {
		cmd := exec.CommandContext(ctx, path, argv[1:]...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		cmd.WaitDelay = time.Second
		start := time.Now()
		err := cmd.Run()
		took := time.Since(start)
		if err != nil {
			tail := strings.TrimSpace(stderr.String())
			if i := strings.LastIndexByte(tail, '\n'); len(tail) > 300 && i >= 0 {
				tail = tail[i+1:]
			}
			if tail != "" {
				return took, fmt.Errorf("%s: %v: %s", argv[0], err, tail)
			}
			return took, fmt.Errorf("%s: %v", argv[0], err)
		}
		return took, nil
	}, nil
}
