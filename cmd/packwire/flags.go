package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"

	"packwire/internal/units"
)

// parseInterspersed parses flags wherever they stand among the positional
// arguments ("repo create NAME --data DIR"), which the flag package alone
// does not do: it stops at the first positional argument. --help and -h
// become a helpText (printed on stdout, exit 0); a flag the command does not
// know, or a value it cannot take, a usageError that names it.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	acceptDays(fs)
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, flagError(fs, err)
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

// helpText is a command's usage, asked for with --help, -h or "packwire
// help CMD": printed on stdout, exit status 0.
type helpText struct{ text string }

func (h helpText) Error() string { return h.text }

// showHelp renders fs's usage as a helpText.
func showHelp(fs *flag.FlagSet) error {
	var b strings.Builder
	out := fs.Output()
	fs.SetOutput(&b)
	fs.Usage()
	fs.SetOutput(out)
	return helpText{b.String()}
}

var (
	reUndefined = regexp.MustCompile(`^flag provided but not defined: -+(.*)$`)
	reNoValue   = regexp.MustCompile(`^flag needs an argument: -+(.*)$`)
	reBadBool   = regexp.MustCompile(`^invalid boolean value "(.*)" for -+(\S+): .*$`)
	reBadValue  = regexp.MustCompile(`^invalid value "(.*)" for flag -+(\S+): (.*)$`)
)

// flagError turns the flag package's errors into a usageError that names the
// flag as --name, and its ErrHelp into the command's help.
func flagError(fs *flag.FlagSet, err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return showHelp(fs)
	}
	msg := err.Error()
	if m := reUndefined.FindStringSubmatch(msg); m != nil {
		msg = fmt.Sprintf("unknown flag --%s", m[1])
	} else if m := reNoValue.FindStringSubmatch(msg); m != nil {
		msg = fmt.Sprintf("--%s needs a value", m[1])
	} else if m := reBadBool.FindStringSubmatch(msg); m != nil {
		msg = fmt.Sprintf("--%s=%s: a boolean flag takes true or false (--%[1]s=false)", m[2], m[1])
	} else if m := reBadValue.FindStringSubmatch(msg); m != nil {
		reason := m[3]
		if reason == "parse error" || reason == "value out of range" {
			reason = valueKind(fs.Lookup(m[2]), reason)
		}
		msg = fmt.Sprintf("--%s %s: %s", m[2], m[1], reason)
	}
	return usagef("%s: %s (see packwire %s --help)", fs.Name(), msg, fs.Name())
}

// valueKind says what a flag takes, for a value the flag package could not parse.
func valueKind(f *flag.Flag, reason string) string {
	if f == nil {
		return reason
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return reason
	}
	switch g.Get().(type) {
	case int, int64:
		return "not a whole number (" + reason + ")"
	case uint, uint64:
		return "not a whole number of 0 or more (" + reason + ")"
	case float64:
		return "not a number (" + reason + ")"
	}
	return reason
}

// wantArgs checks the positional arguments a command got against the
// number it takes (max < 0: any number). An extra one is named, with a
// hint when it follows a boolean flag ("--fetch-cache off"); syn is the
// command's synopsis, shown when arguments are missing.
func wantArgs(args, pos []string, min, max int, syn string) error {
	if max >= 0 && len(pos) > max {
		extra := pos[max]
		msg := fmt.Sprintf("unexpected argument %q", extra)
		if flagName := boolFlagBefore(args, extra); flagName != "" {
			msg += fmt.Sprintf(" after --%s: a boolean flag takes its value as --%[1]s=%s", flagName, boolWord(extra))
		}
		return usagef("%s\nusage: packwire %s", msg, syn)
	}
	if len(pos) < min {
		return usagef("missing arguments\nusage: packwire %s", syn)
	}
	return nil
}

// boolFlagBefore returns the name of the flag written just before arg
// without a value ("--fetch-cache off"): a flag that takes a value would
// have taken arg, so it is a boolean one.
func boolFlagBefore(args []string, arg string) string {
	for i := 1; i < len(args); i++ {
		if args[i] != arg {
			continue
		}
		prev := args[i-1]
		if strings.HasPrefix(prev, "-") && prev != "--" && prev != "-" && !strings.Contains(prev, "=") {
			return strings.TrimLeft(prev, "-")
		}
	}
	return ""
}

// boolWord maps what people write after a boolean flag to what it takes.
func boolWord(s string) string {
	switch strings.ToLower(s) {
	case "off", "no", "false", "0", "disable", "disabled":
		return "false"
	}
	return "true"
}

// stringList is a repeatable string flag (--key A --key B).
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// newFlagSet returns a flag set whose usage prints the synopsis, the
// description and the flags as --name VALUE. Help goes to stdout and
// errors through run's exit status; the writer is not used.
func newFlagSet(name, synopsis, description string, _ io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // parseInterspersed reports errors itself
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "usage: packwire %s\n\n%s\n", synopsis, description)
		printFlags(out, fs)
	}
	return fs
}

// printFlags lists fs's flags as "  --name VALUE" with their usage and
// default underneath.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	first := true
	fs.VisitAll(func(f *flag.Flag) {
		if first {
			fmt.Fprintln(w, "\nflags:")
			first = false
		}
		dashes := "--"
		if len(f.Name) == 1 {
			dashes = "-"
		}
		line := "  " + dashes + f.Name
		if ph := placeholder(f); ph != "" {
			line += " " + ph
		}
		usage := strings.ReplaceAll(f.Usage, "`", "")
		if d := defaultText(f); d != "" {
			usage += " " + d
		}
		fmt.Fprintf(w, "%s\n        %s\n", line, strings.ReplaceAll(usage, "\n", "\n        "))
	})
}

// placeholders name what a flag's value is, where the type alone says too little.
var placeholders = map[string]string{
	"data": "DIR", "out": "DIR", "work": "DIR", "lab-dir": "DIR",
	"key": "FILE", "o": "FILE", "config": "FILE", "tls-cert": "FILE", "tls-key": "FILE", "ssh-key": "FILE",
	"url": "URL", "push-url": "URL", "governor": "URL",
	"git": "ADDR", "http": "ADDR", "ssh": "ADDR", "metrics": "ADDR", "listen": "ADDR", "upstream": "HOST:PORT",
	"token": "TOKEN", "trusted-proxies": "CIDR,...", "ssh-ciphers": "LIST",
	"database": "URL", "node-url": "URL", "node": "NAME", "log-format": "FORMAT", "default-branch": "BRANCH",
	"token-file": "FILE", "secret-file": "FILE",
}

func placeholder(f *flag.Flag) string {
	if name, _ := flag.UnquoteUsage(f); strings.Contains(f.Usage, "`") {
		return name
	}
	if ph, ok := placeholders[f.Name]; ok {
		return ph
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return "VALUE"
	}
	switch g.Get().(type) {
	case bool:
		return ""
	case time.Duration:
		return "DURATION"
	case sizeOf:
		return "SIZE"
	case int, int64, uint, uint64:
		return "N"
	case float64:
		return "F"
	}
	return "VALUE"
}

// machineDefaults say how the defaults that depend on the machine are
// reckoned, so that help (and the reference made from it) reads the same
// on every machine.
var machineDefaults = map[string]string{
	"max-pack-jobs":          "2 per CPU, at least 4",
	"max-pack-jobs-per-repo": "1 per CPU, at least 2",
	"max-push-jobs":          "2 per CPU, at least 4",
	"max-pushes-per-user":    "half of --max-push-jobs, at least 1",
}

func defaultText(f *flag.Flag) string {
	if how, ok := machineDefaults[f.Name]; ok {
		return "(default " + how + ")"
	}
	switch f.DefValue {
	case "", "0", "0s", "false", "[]":
		return ""
	case "true":
		return fmt.Sprintf("(default true; --%s=false turns it off)", f.Name)
	}
	def := f.DefValue
	if g, ok := f.Value.(flag.Getter); ok {
		if _, isDuration := g.Get().(time.Duration); isDuration {
			// "720h0m0s" reads better as "720h".
			if strings.HasSuffix(def, "m0s") {
				def = strings.TrimSuffix(def, "0s")
			}
			if strings.HasSuffix(def, "h0m") {
				def = strings.TrimSuffix(def, "0m")
			}
		}
	}
	return "(default " + def + ")"
}

// byteSize is an int flag that takes a size as units.ParseBytes reads it
// (524288, 512K, 1M, 1MiB); its default shows as a size too.
type byteSize struct{ n *int }

// sizeOf is what a byteSize's Get returns, so that help, the TOML file and
// error messages can tell a size from a count.
type sizeOf int

func sizeVar(fs *flag.FlagSet, p *int, name string, value int, usage string) {
	*p = value
	fs.Var(byteSize{p}, name, usage)
}

func (b byteSize) String() string {
	if b.n == nil {
		return "0"
	}
	return formatSize(int64(*b.n))
}

func (b byteSize) Set(s string) error {
	v, err := units.ParseBytes(s)
	if err != nil {
		return errors.New("a size like 524288, 512K or 1M")
	}
	if v > 1<<31-1 {
		return errors.New("at most 2G-1")
	}
	*b.n = int(v)
	return nil
}

func (b byteSize) Get() any { return sizeOf(*b.n) }

// formatSize writes n in the largest unit that keeps it whole: 512K, 1M.
func formatSize(n int64) string {
	for _, u := range []struct {
		shift  uint
		suffix string
	}{{30, "G"}, {20, "M"}, {10, "K"}} {
		if n != 0 && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

// acceptDays lets every duration flag of fs take days too ("30d", "1d12h"),
// which sysadmins write for lifetimes and retention.
func acceptDays(fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		if _, done := f.Value.(dayDuration); done {
			return
		}
		if g, ok := f.Value.(flag.Getter); ok {
			if _, isDuration := g.Get().(time.Duration); isDuration {
				f.Value = dayDuration{g}
			}
		}
	})
}

// dayDuration is a duration flag that also takes a number of days.
type dayDuration struct{ flag.Getter }

var reDays = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)d(.*)$`)

func (d dayDuration) Set(s string) error {
	v, err := parseDuration(s)
	if err != nil {
		return err
	}
	return d.Getter.Set(v.String())
}

// parseDuration reads a Go duration ("90s", "720h") or days first ("30d",
// "1d12h").
func parseDuration(s string) (time.Duration, error) {
	bad := fmt.Errorf("a duration like 720h, 30m, 90s or 30d")
	if m := reDays.FindStringSubmatch(strings.TrimSpace(s)); m != nil {
		days, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			return 0, bad
		}
		v := time.Duration(days * float64(24*time.Hour))
		if m[2] != "" {
			rest, err := time.ParseDuration(m[2])
			if err != nil {
				return 0, bad
			}
			v += rest
		}
		return v, nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return 0, bad
	}
	return v, nil
}

// checked is a flag whose values must pass check wherever they come from:
// Set refuses one that does not, which covers the command line and the
// config file (applyConfig sets flags through Set), and checkValue asks
// check about a file's value that the command line overrides.
type checked struct {
	flag.Getter
	check func(v any) error // v as Get returns it: int, int64, float64, time.Duration, string
}

func (c checked) Set(s string) error {
	old := c.Getter.String()
	if err := c.Getter.Set(s); err != nil {
		return err
	}
	if err := c.check(c.Getter.Get()); err != nil {
		c.Getter.Set(old)
		return err
	}
	return nil
}

// checkFlags makes every flag of fs a checked one: a flag named in rules
// takes its rule, every other count, size, rate and duration must be 0 or
// more (no flag of serve means anything by a negative value), and other
// flags take any value. Call it once the flags are defined.
func checkFlags(fs *flag.FlagSet, rules map[string]func(any) error) {
	fs.VisitAll(func(f *flag.Flag) {
		g, ok := f.Value.(flag.Getter)
		if !ok {
			return
		}
		rule := rules[f.Name]
		if rule == nil {
			switch g.Get().(type) {
			case int, int64, float64, time.Duration:
				rule = atLeast(0)
			default:
				return
			}
		}
		f.Value = checked{g, rule}
	})
}

// atLeast is the rule of a number or duration of min or more.
func atLeast(min int64) func(any) error {
	return func(v any) error {
		var n float64
		what := "a whole number"
		switch v := v.(type) {
		case int:
			n = float64(v)
		case int64:
			n = float64(v)
		case float64:
			n, what = v, "a number"
		case time.Duration:
			if v < time.Duration(min) {
				return fmt.Errorf("must be a duration of %v or more", min) // nanoseconds: min is 0 here
			}
			return nil
		}
		if n < float64(min) {
			return fmt.Errorf("must be %s of %d or more", what, min)
		}
		return nil
	}
}

// ruleOf is the check of a flag made by checkFlags, nil for another.
func ruleOf(f *flag.Flag) func(any) error {
	v := f.Value
	if d, ok := v.(dayDuration); ok {
		v = d.Getter
	}
	if c, ok := v.(checked); ok {
		return c.check
	}
	return nil
}

// flagSet reports whether the flag was given, on the command line or in
// the --config file (applied with fs.Set).
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
