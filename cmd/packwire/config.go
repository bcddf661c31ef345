package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// envConfig names the environment variable that is --config's default.
const envConfig = "PACKWIRE_CONFIG"

// applyConfig reads the TOML file at path, whose keys are the names of fs's
// flags (max-pack-jobs = 8, http = ":8080", timeout = "10m"), and sets each
// flag the command line did not set: the command line wins over the file.
// Every key is checked, overridden ones included, so a broken file is
// reported whatever the command line says; errors name the file, the line
// and the key.
func applyConfig(fs *flag.FlagSet, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	text := string(b)
	var values map[string]any
	if _, err := toml.Decode(text, &values); err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return usagef("config %s:%d: %s", path, pe.Position.Line, pe.Message)
		}
		return usagef("config %s: %v", path, err)
	}
	onCommandLine := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { onCommandLine[f.Name] = true })

	type entry struct {
		key  string
		line int
	}
	var entries []entry
	for k := range values {
		entries = append(entries, entry{k, keyLine(text, k)})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].line < entries[j].line })
	for _, e := range entries {
		at := fmt.Sprintf("config %s:%d", path, e.line)
		f := fs.Lookup(e.key)
		if f == nil || e.key == "config" {
			msg := fmt.Sprintf("%s: unknown key %q", at, e.key)
			if near := nearestFlag(fs, e.key); near != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", near)
			}
			return usagef("%s; the keys are the flags of packwire serve --help, without --", msg)
		}
		v, err := configValue(f, values[e.key])
		if err != nil {
			return usagef("%s: %s: %v", at, e.key, err)
		}
		// Parse even what the command line overrides: a bad value is
		// reported now, not when the flag is next left out.
		if err := checkValue(f, v); err != nil {
			return usagef("%s: %s = %q: %v", at, e.key, v, err)
		}
		if onCommandLine[e.key] {
			continue
		}
		if err := fs.Set(e.key, v); err != nil {
			return usagef("%s: %s = %q: %v", at, e.key, v, err)
		}
	}
	return nil
}

// configValue turns a TOML value into the text the flag parses, if its
// type is the flag's: booleans for switches, integers for counts and
// sizes, strings for durations ("30s") and addresses; a list of strings
// for a comma separated list.
func configValue(f *flag.Flag, v any) (string, error) {
	g, _ := f.Value.(flag.Getter)
	var want any
	if g != nil {
		want = g.Get()
	}
	switch want.(type) {
	case bool:
		if b, ok := v.(bool); ok {
			return strconv.FormatBool(b), nil
		}
		return "", fmt.Errorf("want true or false, got %s", tomlType(v))
	case int, int64, uint, uint64:
		if n, ok := v.(int64); ok {
			return strconv.FormatInt(n, 10), nil
		}
		return "", fmt.Errorf("want a whole number (no quotes), got %s", tomlType(v))
	case float64:
		switch n := v.(type) {
		case int64:
			return strconv.FormatInt(n, 10), nil
		case float64:
			return strconv.FormatFloat(n, 'g', -1, 64), nil
		}
		return "", fmt.Errorf("want a number, got %s", tomlType(v))
	case sizeOf:
		switch n := v.(type) {
		case int64:
			return strconv.FormatInt(n, 10), nil
		case string:
			return n, nil
		}
		return "", fmt.Errorf("want a size: a whole number of bytes or a string (\"512K\", \"1M\"), got %s", tomlType(v))
	case time.Duration:
		if s, ok := v.(string); ok {
			return s, nil
		}
		return "", fmt.Errorf("want a duration as a string (\"30s\", \"10m\", \"30d\"), got %s", tomlType(v))
	}
	switch s := v.(type) {
	case string:
		return s, nil
	case []any:
		parts := make([]string, len(s))
		for i, e := range s {
			str, ok := e.(string)
			if !ok {
				return "", fmt.Errorf("want a string or a list of strings, got a list holding %s", tomlType(e))
			}
			parts[i] = str
		}
		return strings.Join(parts, ","), nil
	}
	return "", fmt.Errorf("want a string, got %s", tomlType(v))
}

// checkValue parses v as f would and checks it against f's rule (see
// checkFlags), without setting f.
func checkValue(f *flag.Flag, v string) error {
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return nil
	}
	var parsed any = v
	var err error
	switch g.Get().(type) {
	case bool:
		_, err = strconv.ParseBool(v)
	case int:
		var n int64
		n, err = strconv.ParseInt(v, 10, 64)
		parsed = int(n)
	case int64:
		parsed, err = strconv.ParseInt(v, 10, 64)
	case uint, uint64:
		_, err = strconv.ParseUint(v, 10, 64)
	case float64:
		parsed, err = strconv.ParseFloat(v, 64)
	case time.Duration:
		parsed, err = parseDuration(v)
	case sizeOf:
		var n int
		err = byteSize{&n}.Set(v)
		parsed = sizeOf(n)
	}
	if err != nil {
		return err
	}
	if rule := ruleOf(f); rule != nil {
		return rule(parsed)
	}
	return nil
}

func tomlType(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("the string %q", v)
	case int64:
		return fmt.Sprintf("the number %d", v)
	case float64:
		return fmt.Sprintf("the number %g", v)
	case bool:
		return fmt.Sprintf("%t", v)
	case []any:
		return "a list"
	case map[string]any:
		return "a table"
	}
	return fmt.Sprintf("a %T", v)
}

// keyLine finds the line that defines a top-level key: "key = ..." or a
// table header "[key]" / "[[key]]" (0 if not found).
func keyLine(text, key string) int {
	q := regexp.QuoteMeta(key)
	assign := regexp.MustCompile(`^\s*(?:` + q + `|"` + q + `"|'` + q + `')\s*[=.]`)
	header := regexp.MustCompile(`^\s*\[\[?\s*(?:` + q + `|"` + q + `"|'` + q + `')\s*[\].]`)
	inTable := false
	for i, line := range strings.Split(text, "\n") {
		if header.MatchString(line) {
			return i + 1
		}
		if strings.HasPrefix(strings.TrimSpace(line), "[") {
			inTable = true // keys below a header are that table's
		}
		if !inTable && assign.MatchString(line) {
			return i + 1
		}
	}
	return 0
}

// nearestFlag is the flag name closest to a mistyped key (at most two
// edits away), or "".
func nearestFlag(fs *flag.FlagSet, key string) string {
	best, bestDist := "", 3
	fs.VisitAll(func(f *flag.Flag) {
		if d := editDistance(key, f.Name); d < bestDist && f.Name != "config" {
			best, bestDist = f.Name, d
		}
	})
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
