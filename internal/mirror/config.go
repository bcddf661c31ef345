package mirror

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"packwire/internal/repo"
)

// Where a repository's mirroring is configured: its own git config, so
// that it moves with the repository when it is renamed, deleted and
// restored, or backed up (as packwire.quota does). Credentials are not in
// it (see credentials.go).
const (
	// KeyPullMirror names the remote a read-only pull mirror follows.
	KeyPullMirror = "packwire.pullMirror"
	// KeyInterval is how often a pull mirror is synced (a Go duration).
	KeyInterval = "packwire.mirrorInterval"
	// PullRemote is the remote of a pull mirror: the one git clone
	// --mirror configures (url, fetch = +refs/*:refs/*, mirror = true).
	PullRemote = "origin"
	// PushRemotePrefix names push mirrors' remotes: packwire-push-1, ...
	PushRemotePrefix = "packwire-push-"
)

// DefaultInterval is a pull mirror's sync interval unless set.
const DefaultInterval = 15 * time.Minute

// Config is what a repository's config says about mirroring.
type Config struct {
	PullRemote string        // "": not a pull mirror
	PullURL    string        // the pull remote's url (no credentials)
	Interval   time.Duration // between syncs of a pull mirror
	Pushes     []PushMirror  // by id
}

// IsPullMirror reports whether the repository is a read-only pull mirror.
func (c Config) IsPullMirror() bool { return c.PullRemote != "" }

// Push returns the push mirror with the id.
func (c Config) Push(id int) (PushMirror, bool) {
	for _, p := range c.Pushes {
		if p.ID == id {
			return p, true
		}
	}
	return PushMirror{}, false
}

// PushMirror is a remote every acknowledged push is sent on to.
type PushMirror struct {
	ID     int
	Remote string // packwire-push-ID
	URL    string // no credentials
}

// ReadConfig reads the repository's config file without spawning git:
// pushes ask it (is this a read-only mirror, which push mirrors does it
// have), as they ask the quota.
func ReadConfig(r repo.Repo) (Config, error) {
	entries, err := readGitConfig(filepath.Join(r.Path, "config"))
	if err != nil {
		return Config{}, err
	}
	c := Config{Interval: DefaultInterval}
	urls := map[string]string{}
	for _, e := range entries {
		switch {
		case e.section == "packwire" && e.key == "pullmirror":
			c.PullRemote = e.value
		case e.section == "packwire" && e.key == "mirrorinterval":
			if d, err := time.ParseDuration(e.value); err == nil && d > 0 {
				c.Interval = d
			}
		case e.section == "remote" && e.key == "url":
			urls[e.subsection] = e.value
		}
	}
	c.PullURL = urls[c.PullRemote]
	for remote, url := range urls {
		idText, ok := strings.CutPrefix(remote, PushRemotePrefix)
		if !ok {
			continue
		}
		if id, err := strconv.Atoi(idText); err == nil && id > 0 {
			c.Pushes = append(c.Pushes, PushMirror{ID: id, Remote: remote, URL: url})
		}
	}
	sort.Slice(c.Pushes, func(i, j int) bool { return c.Pushes[i].ID < c.Pushes[j].ID })
	return c, nil
}

// ReadOnlyRefusal is what a push to the repository is told if it is a
// pull mirror ("": it is not one, or its config cannot be read: a push
// then goes on as for any repository).
func ReadOnlyRefusal(r repo.Repo) string {
	c, err := ReadConfig(r)
	if err != nil || !c.IsPullMirror() {
		return ""
	}
	return fmt.Sprintf("repository '%s' is a read-only mirror of %s; push there instead", r.Name, Redact(c.PullURL))
}

// setConfig sets (or with no value, unsets) keys in the config file of
// the git directory dir. Values never carry credentials.
func setConfig(ctx context.Context, dir string, kv ...string) error {
	for i := 0; i+1 < len(kv); i += 2 {
		if _, err := git(ctx, "", nil, "config", "--file", filepath.Join(dir, "config"), kv[i], kv[i+1]); err != nil {
			return err
		}
	}
	return nil
}

// configEntry is one "key = value" of a git config file.
type configEntry struct {
	section, subsection, key, value string // section and key lower-cased, as git compares them
}

// readGitConfig parses a git config file: sections with subsections
// ([remote "origin"], and the old [remote.origin]), quoted values with
// escapes, comments, continued lines. Includes are not followed: what
// packwire sets lives in the file itself.
func readGitConfig(path string) ([]configEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var entries []configEntry
	var section, subsection string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		for strings.HasSuffix(line, `\`) && !strings.HasSuffix(line, `\\`) && sc.Scan() {
			line = line[:len(line)-1] + sc.Text()
		}
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if line[0] == '[' {
			section, subsection = parseSection(line)
			continue
		}
		key, value, hasValue := strings.Cut(line, "=")
		key = strings.ToLower(strings.TrimSpace(key))
		if i := strings.IndexAny(key, "#;"); i >= 0 {
			key = strings.TrimSpace(key[:i])
		}
		v := "true" // a bare key is a boolean
		if hasValue {
			v = parseValue(value)
		}
		entries = append(entries, configEntry{section: section, subsection: subsection, key: key, value: v})
	}
	return entries, sc.Err()
}

// parseSection reads `[name]`, `[name "sub"]` or `[name.sub]`.
func parseSection(line string) (section, subsection string) {
	inner := strings.TrimPrefix(line, "[")
	if q := strings.IndexByte(inner, '"'); q >= 0 {
		section = strings.ToLower(strings.TrimSpace(inner[:q]))
		var b strings.Builder
		for i := q + 1; i < len(inner); i++ {
			c := inner[i]
			if c == '\\' && i+1 < len(inner) {
				i++
				b.WriteByte(inner[i])
				continue
			}
			if c == '"' {
				break
			}
			b.WriteByte(c)
		}
		return section, b.String()
	}
	if end := strings.IndexByte(inner, ']'); end >= 0 {
		inner = inner[:end]
	}
	name, sub, _ := strings.Cut(strings.TrimSpace(inner), ".")
	return strings.ToLower(name), strings.ToLower(sub)
}

// parseValue reads a value as git does: quotes group, backslash escapes,
// a comment starts at # or ; outside quotes, trailing blanks go.
func parseValue(s string) string {
	s = strings.TrimLeft(s, " \t")
	var b strings.Builder
	inQuote := false
	trailing := 0 // blanks written since the last non-blank outside quotes
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\' && i+1 < len(s):
			i++
			switch s[i] {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			case 'b':
				if b.Len() > 0 {
					str := b.String()
					b.Reset()
					b.WriteString(str[:len(str)-1])
				}
			default:
				b.WriteByte(s[i])
			}
			trailing = 0
		case c == '"':
			inQuote = !inQuote
			trailing = 0
		case !inQuote && (c == '#' || c == ';'):
			out := b.String()
			return out[:len(out)-trailing]
		case !inQuote && (c == ' ' || c == '\t'):
			b.WriteByte(c)
			trailing++
		default:
			b.WriteByte(c)
			trailing = 0
		}
	}
	out := b.String()
	return out[:len(out)-trailing]
}
