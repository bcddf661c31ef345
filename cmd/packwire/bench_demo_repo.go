package main

import (
	"context"
	"errors"
)

// buildDemoRepo makes the demo's repository at path and describes it.
func buildDemoRepo(ctx context.Context, path string, scale float64) (string, error) {
	return "", errors.New("the synthetic repository generator (synth) is not merged yet")
}
