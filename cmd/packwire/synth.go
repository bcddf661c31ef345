package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"packwire/internal/lab/synth"
)

const synthHelp = `Make a deterministic bare repository with the shape of one of the clone
study's repositories, so the study can be replayed without downloading
anything. At --scale F it has F times the study's commits, trees and blobs:

  jquery   7,873 commits    22,579 trees    14,779 blobs   (40 MB)
  swift  132,316 commits   649,322 trees   390,116 blobs  (750 MB)
  linux  968,500 commits 4,619,864 trees 2,174,798 blobs (4,000 MB)

and their layout: directory depth and fan-out, file sizes, commits of one to
five files, merged topic branches, release branches with backports,
annotated tags. The same shape, scale and seed give the same object ids.

--pull-refs N adds what hosted repositories carry beside their history:
refs/pull/1/head .. refs/pull/N/head, pull requests on short side branches
off commits spread over main's history, never merged, so clones do not
fetch them (fetch one by name: git fetch URL refs/pull/7/head). Their sizes
follow a survey of 10,193 merged GitHub pull requests: commits median 1
(third quartile 3, at most 20), files changed median 3 (quartiles 1 and 10,
at most 20), a few lines per file. With jquery's 5,200 they triple the
objects stored (jquery x1: 45,272 in a clone, 155,239 in all).
Branches, tags and their objects stay exactly as without --pull-refs.

The repository is as git fast-import writes it: one pack, versions of a
file stored as deltas, no bitmap.
Written under DATA/repos it is served at once; "packwire maintain NAME" (or
"packwire repo import NAME DIR" from elsewhere) gives it the serving layout:

  packwire synth --shape jquery --scale 1 --pull-refs 5200 --out packwire-data/repos/jq.git
  packwire maintain jq`

func cmdSynth(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("synth", "synth --shape "+strings.Join(synth.Shapes(), "|")+" --out DIR [--scale F] [--seed N] [--pull-refs N]", synthHelp, stderr)
	var o synth.Options
	var quiet bool
	fs.StringVar(&o.Shape, "shape", "", "repository shape: "+strings.Join(synth.Shapes(), ", "))
	fs.Float64Var(&o.Scale, "scale", 1, fmt.Sprintf("fraction of the study's object counts (at most %d)", synth.MaxScale))
	fs.StringVar(&o.Out, "out", "", "bare repository to create (must not exist, or be empty)")
	fs.Int64Var(&o.Seed, "seed", 1, "random seed: the same seed gives the same repository")
	fs.IntVar(&o.PullRefs, "pull-refs", 0, fmt.Sprintf("add refs/pull/1/head .. refs/pull/N/head, pull requests clones do not fetch (at most %d)", synth.MaxPullRefs))
	fs.BoolVar(&quiet, "quiet", false, "no progress lines")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return wantArgs(args, pos, 0, 0, "synth --shape "+strings.Join(synth.Shapes(), "|")+" --out DIR [FLAGS] (no arguments besides flags)")
	case o.Shape == "":
		return usagef("synth needs --shape (%s)", strings.Join(synth.Shapes(), ", "))
	case o.Out == "":
		return usagef("synth needs --out DIR")
	}
	if !quiet {
		o.Progress = stderr
	}
	res, err := synth.Generate(ctx, o)
	if err != nil {
		return err
	}
	pulls := ""
	if res.PullRefs > 0 {
		pulls = fmt.Sprintf(", %d pull refs", res.PullRefs)
	}
	fmt.Fprintf(stdout, "%s x%g (seed %d): %d commits, %d trees, %d blobs, %d branches, %d tags%s\n",
		o.Shape, o.Scale, o.Seed, res.Commits, res.Trees, res.Blobs, res.Branches, res.Tags, pulls)
	fmt.Fprintf(stdout, "main %s, %.1f MB on disk at %s, made in %s\n",
		res.Head, float64(res.Bytes)/1e6, o.Out, res.Elapsed.Round(1e7))
	return nil
}
