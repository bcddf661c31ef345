package main

import (
	"context"
	"fmt"
	"time"

	"packwire/internal/lab/synth"
)

// buildDemoRepo makes the demo's repository at path with synth and
// describes it.
func buildDemoRepo(ctx context.Context, path string, scale float64) (string, error) {
	res, err := synth.Generate(ctx, synth.Options{Shape: "jquery", Scale: scale, Out: path, Seed: 1})
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("synth jquery x%g (%d commits, %d trees, %d blobs, %d branches, %d tags, %s, made in %s)",
		scale, res.Commits, res.Trees, res.Blobs, res.Branches, res.Tags, bytesText(res.Bytes), res.Elapsed.Round(100*time.Millisecond)), nil
}
