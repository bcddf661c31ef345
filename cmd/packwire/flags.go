package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// parseInterspersed parses flags wherever they stand among the positional
// arguments ("repo create NAME --data DIR"), which the flag package alone
// does not do: it stops at the first positional argument.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		// The flag package stops at "--" too, having consumed it: what
		// follows is positional whatever it looks like.
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// stringList is a repeatable string flag (--key A --key B).
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// newFlagSet returns a flag set whose usage prints the synopsis and the flags.
func newFlagSet(name, synopsis, description string, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintf(out, "usage: packwire %s\n\n%s\n", synopsis, description)
		hasFlags := false
		fs.VisitAll(func(*flag.Flag) { hasFlags = true })
		if hasFlags {
			fmt.Fprintln(out, "\nflags:")
			fs.PrintDefaults()
		}
	}
	return fs
}
