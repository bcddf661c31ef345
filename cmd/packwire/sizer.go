package main

import (
	"context"
	"io"

	"packwire/internal/lab/sizer"
)

const sizerHelp = `Measure a repository as git-sizer does: object counts and total sizes by
type, the biggest objects, history and tag depth, references, and the
biggest checkout among HEAD and the branch tips. Each figure gets a level
of concern: one star per multiple of git-sizer's threshold for it (e.g.
500 k commits, 2,500 entries in one tree, a 10 MiB blob, 50 k files in a
checkout), "!!!" past 30. Counts and sizes cover every object stored,
reachable or not.

  packwire sizer packwire-data/repos/jq.git
  packwire sizer --json . > sizes.json`

func cmdSizer(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("sizer", "sizer REPO [--json] [--threshold N]", sizerHelp, stderr)
	asJSON := fs.Bool("json", false, "print the report as JSON (stable field names; concern = value / threshold)")
	threshold := fs.Float64("threshold", 0, "show only figures with at least this level of concern (1 = one star)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(args, pos, 1, 1, "sizer REPO [--json] [--threshold N]"); err != nil {
		return err
	}
	r, err := sizer.Measure(ctx, pos[0])
	if err != nil {
		return err
	}
	if *asJSON {
		return r.WriteJSON(stdout)
	}
	return r.WriteTable(stdout, *threshold)
}
