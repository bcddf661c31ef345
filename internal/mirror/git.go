package mirror

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"packwire/internal/procgroup"
)

// baseConfig is passed to every git a mirror runs.
var baseConfig = []string{
	"-c", "safe.directory=*",
	"-c", "gc.auto=0", // maintenance owns the object layout
	"-c", "core.logAllRefUpdates=false",
	"-c", "pack.writeReverseIndex=true",
	"-c", "fetch.unpackLimit=1", // what a fetch brings stays one pack: its size is the sync's bytes
	"-c", "protocol.ext.allow=never",
}

// gitRun is one git a mirror ran, with what it cost.
type gitRun struct {
	stdout, stderr string
	usage          procgroup.Usage
}

// git runs git with the mirror settings in dir ("": the current
// directory), killed as a process group when ctx ends, never prompting.
func git(ctx context.Context, dir string, env []string, args ...string) (gitRun, error) {
	return gitIn(ctx, dir, env, nil, args...)
}

func gitIn(ctx context.Context, dir string, env []string, stdin io.Reader, args ...string) (gitRun, error) {
	cmd := exec.Command("git", append(append([]string{}, baseConfig...), args...)...)
	cmd.Dir = dir
	cmd.Env = append(append(cleanEnv(), "GIT_TERMINAL_PROMPT=0"), env...)
	cmd.Stdin = stdin
	var out, errb strings.Builder
	cmd.Stdout = &out
	cmd.Stderr = &errb
	err := procgroup.Run(ctx, cmd)
	run := gitRun{stdout: out.String(), stderr: errb.String()}
	if cmd.ProcessState != nil {
		run.usage = procgroup.UsageOf(cmd.ProcessState)
	}
	if ctx.Err() != nil {
		return run, ctx.Err()
	}
	if err != nil {
		return run, fmt.Errorf("git %s: %v: %s", gitVerb(args), err, gitMessage(run.stderr))
	}
	return run, nil
}

// gitVerb names a git command by its first non-option argument.
func gitVerb(args []string) string {
	for i := 0; i < len(args); i++ {
		if args[i] == "-c" || args[i] == "-C" {
			i++
			continue
		}
		if !strings.HasPrefix(args[i], "-") {
			return args[i]
		}
	}
	return ""
}

// gitMessage is what git said went wrong: its error and fatal lines (at
// most three), else its last lines.
func gitMessage(stderr string) string {
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	var picked []string
	for _, l := range lines {
		if strings.HasPrefix(l, "fatal: ") || strings.HasPrefix(l, "error: ") {
			picked = append(picked, l)
		}
	}
	if len(picked) == 0 {
		picked = lines
	}
	if len(picked) > 3 {
		picked = picked[len(picked)-3:]
	}
	return strings.Join(picked, " / ")
}

// cleanEnv is packwire's environment without git's variables, which a
// test or a hook may have set.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "GIT_") && name != "GIT_CONFIG_NOSYSTEM" && name != "GIT_CONFIG_GLOBAL" && name != "GIT_EXEC_PATH" {
			continue
		}
		if strings.HasPrefix(name, "PACKWIRE_MIRROR_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// cost adds up what a series of git runs took.
type cost struct {
	userCPU, sysCPU time.Duration
}

func (c *cost) add(r gitRun) {
	c.userCPU += r.usage.UserCPU
	c.sysCPU += r.usage.SysCPU
}
