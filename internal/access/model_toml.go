package access

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"golang.org/x/crypto/ssh"

	"packwire/internal/store"
)

// File is the access model as a reviewable TOML file.
type File struct {
	AnonymousRead string         `toml:"anonymous_read"` // "on" or "off", server-wide
	AnonReads     []FileAnonRead `toml:"anonymous_read_override"`
	Users         []FileUser     `toml:"user"`
	Grants        []FileGrant    `toml:"grant"`
	Rules         []FileRule     `toml:"rule"`
	Tokens        []FileToken    `toml:"token"`
}

type FileAnonRead struct {
	Repo string `toml:"repo"`
	Read string `toml:"read"` // on or off
}

type FileUser struct {
	Name string   `toml:"name"`
	Keys []string `toml:"keys"` // authorized_keys lines
}

type FileGrant struct {
	User string `toml:"user"`
	Role string `toml:"role"`
	Repo string `toml:"repo"`
}

type FileRule struct {
	Action string   `toml:"action"` // allow or deny
	Ops    []string `toml:"ops"`
	Repo   string   `toml:"repo"`
	Ref    string   `toml:"ref"`
	Who    string   `toml:"who"`
}

// FileToken is a token's metadata, exported for review. Import ignores it:
// a token's secret exists only where it was handed out.
type FileToken struct {
	ID      string `toml:"id"`
	User    string `toml:"user"`
	Created string `toml:"created"`
	Expires string `toml:"expires,omitempty"`
	Revoked string `toml:"revoked,omitempty"`
}

const fileHeader = `# packwire access model (packwire access export). Review, edit, then
# "packwire access import FILE" replaces users, keys, grants, rules and
# anonymous read settings with this file's. Rules apply in the order listed;
# the first matching rule decides. [[token]] entries are informational:
# token secrets and hashes are never exported, and import ignores them
# (users that stay keep their tokens).

`

// Export renders the whole access model as TOML.
func (c *Controller) Export(ctx context.Context) ([]byte, error) {
	st := c.Store
	var f File
	var err error
	if f.AnonymousRead, err = st.Setting(ctx, SettingAnonRead, "on"); err != nil {
		return nil, err
	}
	ars, err := st.AnonReads(ctx)
	if err != nil {
		return nil, err
	}
	for _, a := range ars {
		f.AnonReads = append(f.AnonReads, FileAnonRead{Repo: a.RepoPattern, Read: onOff(a.Enabled)})
	}
	users, err := st.ListUsers(ctx)
	if err != nil {
		return nil, err
	}
	keys, err := st.Keys(ctx, "")
	if err != nil {
		return nil, err
	}
	for _, u := range users {
		fu := FileUser{Name: u.Name, Keys: []string{}}
		for _, k := range keys {
			if k.User == u.Name {
				line := strings.TrimSpace(k.PublicKey)
				if k.Comment != "" {
					line += " " + k.Comment
				}
				fu.Keys = append(fu.Keys, line)
			}
		}
		f.Users = append(f.Users, fu)
	}
	grants, err := st.Grants(ctx, "")
	if err != nil {
		return nil, err
	}
	for _, g := range grants {
		f.Grants = append(f.Grants, FileGrant{User: g.User, Role: g.Role, Repo: g.RepoPattern})
	}
	rules, err := st.Rules(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range rules {
		action := "deny"
		if r.Allow {
			action = "allow"
		}
		f.Rules = append(f.Rules, FileRule{Action: action, Ops: strings.Split(r.Ops, ","), Repo: r.RepoPattern, Ref: r.RefPattern, Who: r.Who})
	}
	tokens, err := st.Tokens(ctx)
	if err != nil {
		return nil, err
	}
	for _, t := range tokens {
		ft := FileToken{ID: t.ID, User: t.User, Created: t.Created.UTC().Format(time.RFC3339)}
		if !t.Expires.IsZero() {
			ft.Expires = t.Expires.UTC().Format(time.RFC3339)
		}
		if !t.Revoked.IsZero() {
			ft.Revoked = t.Revoked.UTC().Format(time.RFC3339)
		}
		f.Tokens = append(f.Tokens, ft)
	}
	var buf bytes.Buffer
	buf.WriteString(fileHeader)
	enc := toml.NewEncoder(&buf)
	enc.Indent = ""
	if err := enc.Encode(f); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// ParseFile decodes and validates a model file. Unknown keys are errors
// that name their line, so a typo never silently drops a rule.
func ParseFile(data []byte) (store.Model, error) {
	var f File
	md, err := toml.Decode(string(data), &f)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return store.Model{}, fmt.Errorf("line %d: %s", pe.Position.Line, pe.Message)
		}
		return store.Model{}, err
	}
	if und := md.Undecoded(); len(und) > 0 {
		k := und[0]
		return store.Model{}, fmt.Errorf("line %d: unknown key %q", keyLine(data, k), k.String())
	}
	m := store.Model{AnonReadDefault: f.AnonymousRead}
	if m.AnonReadDefault == "" {
		m.AnonReadDefault = "on"
	}
	if m.AnonReadDefault != "on" && m.AnonReadDefault != "off" {
		return m, fmt.Errorf("anonymous_read: %q is not on or off", f.AnonymousRead)
	}
	for i, a := range f.AnonReads {
		if err := ValidPattern(a.Repo); err != nil {
			return m, fmt.Errorf("anonymous_read_override %d: %v", i+1, err)
		}
		if a.Read != "on" && a.Read != "off" {
			return m, fmt.Errorf("anonymous_read_override %d: read %q is not on or off", i+1, a.Read)
		}
		m.AnonReads = append(m.AnonReads, store.AnonRead{RepoPattern: a.Repo, Enabled: a.Read == "on"})
	}
	users := map[string]bool{}
	keyOwner := map[string]string{} // fingerprint -> user
	for i, u := range f.Users {
		if !ValidUserName(u.Name) {
			return m, fmt.Errorf("user %d: invalid name %q", i+1, u.Name)
		}
		if users[u.Name] {
			return m, fmt.Errorf("user %q listed twice", u.Name)
		}
		users[u.Name] = true
		m.Users = append(m.Users, store.User{Name: u.Name})
		for _, line := range u.Keys {
			pub, comment, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
			if err != nil {
				return m, fmt.Errorf("user %q: bad key %q: %v", u.Name, trunc(line, 40), err)
			}
			fp := ssh.FingerprintSHA256(pub)
			if owner, dup := keyOwner[fp]; dup {
				return m, fmt.Errorf("key %s is listed twice (users %q and %q): a key identifies one user", fp, owner, u.Name)
			}
			keyOwner[fp] = u.Name
			m.Keys = append(m.Keys, store.Key{Fingerprint: fp, User: u.Name,
				PublicKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub))), Comment: comment})
		}
	}
	granted := map[[2]string]int{} // user, repo -> grant number
	for i, g := range f.Grants {
		if !users[g.User] {
			return m, fmt.Errorf("grant %d: no user %q in the file", i+1, g.User)
		}
		if n, dup := granted[[2]string{g.User, g.Repo}]; dup {
			return m, fmt.Errorf("grant %d: %s already has a grant on %s (grant %d)", i+1, g.User, g.Repo, n)
		}
		granted[[2]string{g.User, g.Repo}] = i + 1
		if _, err := ParseRole(g.Role); err != nil {
			return m, fmt.Errorf("grant %d: %v", i+1, err)
		}
		if err := ValidPattern(g.Repo); err != nil {
			return m, fmt.Errorf("grant %d: %v", i+1, err)
		}
		m.Grants = append(m.Grants, store.Grant{User: g.User, Role: g.Role, RepoPattern: g.Repo})
	}
	for i, r := range f.Rules {
		sr := store.Rule{Position: i + 1, RepoPattern: r.Repo, RefPattern: r.Ref, Who: r.Who}
		switch r.Action {
		case "allow":
			sr.Allow = true
		case "deny":
		default:
			return m, fmt.Errorf("rule %d: action %q is not allow or deny", i+1, r.Action)
		}
		ops, err := ParseOps(strings.Join(r.Ops, ","))
		if err != nil {
			return m, fmt.Errorf("rule %d: %v", i+1, err)
		}
		sr.Ops = ops
		for _, p := range []string{r.Repo, r.Ref} {
			if err := ValidPattern(p); err != nil {
				return m, fmt.Errorf("rule %d: %v", i+1, err)
			}
		}
		if err := ValidWho(r.Who); err != nil {
			return m, fmt.Errorf("rule %d: %v", i+1, err)
		}
		if r.Who != "*" && !strings.HasPrefix(r.Who, "role:") && !users[r.Who] {
			// As for grants: the file replaces the users, so a rule for
			// anyone else would never match.
			return m, fmt.Errorf("rule %d: no user %q in the file", i+1, r.Who)
		}
		m.Rules = append(m.Rules, sr)
	}
	return m, nil
}

// Import replaces the access model with a file's. Users not in the file
// are removed (with their keys, tokens and grants) only if prune; otherwise
// the import is refused with a *store.UsersRemovedError. The changes it
// makes are computed before, outside its transaction: an admin command
// writing meanwhile may make them differ.
func (c *Controller) Import(ctx context.Context, data []byte, prune bool) (store.Model, []Change, error) {
	m, changes, err := c.PlanImport(ctx, data)
	if err != nil {
		return m, nil, err
	}
	return m, changes, c.Store.ReplaceModel(ctx, m, prune)
}

// PlanImport parses a model file and says what importing it would change,
// changing nothing.
func (c *Controller) PlanImport(ctx context.Context, data []byte) (store.Model, []Change, error) {
	m, err := ParseFile(data)
	if err != nil {
		return m, nil, err
	}
	cur, err := c.Current(ctx)
	if err != nil {
		return m, nil, err
	}
	return m, Diff(cur, m), nil
}

// keyLine finds the line where key k is defined: its last component as
// "name =" (or a table header naming it) after its parent table's header.
func keyLine(data []byte, k toml.Key) int {
	lines := strings.Split(string(data), "\n")
	last := regexp.QuoteMeta(k[len(k)-1])
	assign := regexp.MustCompile(`^\s*("?)` + last + `("?)\s*[=.]`)
	header := regexp.MustCompile(`^\s*\[\[?\s*` + regexp.QuoteMeta(strings.Join(k, ".")) + `\s*\]\]?`)
	start := 0
	if len(k) > 1 {
		parent := regexp.MustCompile(`^\s*\[\[?\s*` + regexp.QuoteMeta(strings.Join(k[:len(k)-1], ".")) + `\s*\]\]?`)
		for i, l := range lines {
			if parent.MatchString(l) {
				start = i
				// The first parent header whose table holds the key.
				for j := i + 1; j < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[j]), "["); j++ {
					if assign.MatchString(lines[j]) {
						return j + 1
					}
				}
			}
		}
	}
	for i := start; i < len(lines); i++ {
		if header.MatchString(lines[i]) || assign.MatchString(lines[i]) {
			return i + 1
		}
	}
	return 0
}

func trunc(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// ValidUserName: letters, digits, '.', '_', '-', not starting with '.' or '-';
// ClusterUser is reserved for the nodes of a cluster.
func ValidUserName(name string) bool {
	if name == "" || len(name) > 64 || name[0] == '-' || name[0] == '.' || name == ClusterUser {
		return false
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
