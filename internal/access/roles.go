package access

import (
	"fmt"
	"strings"

	"packwire/internal/store"
)

// Role is what a user may do on a repository: read < write < admin.
type Role int

const (
	RoleNone Role = iota
	RoleRead
	RoleWrite
	RoleAdmin
)

func (r Role) String() string {
	switch r {
	case RoleRead:
		return "read"
	case RoleWrite:
		return "write"
	case RoleAdmin:
		return "admin"
	}
	return "none"
}

// ParseRole accepts read, write or admin.
func ParseRole(s string) (Role, error) {
	switch s {
	case "read":
		return RoleRead, nil
	case "write":
		return RoleWrite, nil
	case "admin":
		return RoleAdmin, nil
	}
	return RoleNone, fmt.Errorf("unknown role %q (read, write or admin)", s)
}

// ParseRoleOrNone is ParseRole that maps anything unknown to RoleNone.
func ParseRoleOrNone(s string) Role {
	r, _ := ParseRole(s)
	return r
}

// RefOp is what a push command does to one ref.
type RefOp string

const (
	OpCreate RefOp = "create"
	OpPush   RefOp = "push" // fast-forward update
	OpForce  RefOp = "force-push"
	OpDelete RefOp = "delete"
)

// AllRefOps in canonical order.
var AllRefOps = []RefOp{OpCreate, OpPush, OpForce, OpDelete}

// ParseOps parses a comma separated list of ref operations ("force" is an
// alias of force-push, "all" means every one) into canonical form.
func ParseOps(s string) (string, error) {
	seen := map[RefOp]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		switch f {
		case "all":
			for _, o := range AllRefOps {
				seen[o] = true
			}
		case "force":
			seen[OpForce] = true
		case string(OpCreate), string(OpPush), string(OpForce), string(OpDelete):
			seen[RefOp(f)] = true
		default:
			return "", fmt.Errorf("unknown ref operation %q (create, push, force-push, delete, all)", f)
		}
	}
	var out []string
	for _, o := range AllRefOps {
		if seen[o] {
			out = append(out, string(o))
		}
	}
	return strings.Join(out, ","), nil
}

// ValidWho checks a rule's subject: a user name, role:ROLE or *.
func ValidWho(who string) error {
	if who == "*" {
		return nil
	}
	if r, ok := strings.CutPrefix(who, "role:"); ok {
		_, err := ParseRole(r)
		return err
	}
	if who == "" || strings.ContainsAny(who, " \t\n/:*") {
		return fmt.Errorf("invalid rule subject %q (a user name, role:read|write|admin or *)", who)
	}
	return nil
}

// RuleText renders a rule the way the CLI takes it and logs show it.
func RuleText(r store.Rule) string { return store.RuleText(r) }

// RefDecision is the verdict on one ref operation.
type RefDecision struct {
	Allowed bool
	Rule    *store.Rule // the rule that decided; nil: the default (write role may do all)
}

// Why describes what decided, for logs.
func (d RefDecision) Why() string {
	if d.Rule == nil {
		return "default (write role)"
	}
	return fmt.Sprintf("rule #%d: %s", d.Rule.Position, RuleText(*d.Rule))
}

// DecideRef decides op on ref in repoName for p, who may write there.
// Rules are evaluated in order; the first that matches the repository, the
// ref, the subject and the operation decides. No match: allowed.
func (m *Model) DecideRef(p Principal, repoName, ref string, op RefOp) RefDecision {
	if p.IsCluster() { // replication: the rules were applied where the client pushed
		return RefDecision{Allowed: true}
	}
	role := m.Role(p, repoName)
	for i := range m.Rules {
		r := &m.Rules[i]
		if !hasOp(r.Ops, op) || !Match(r.RepoPattern, repoName) || !Match(r.RefPattern, ref) || !whoMatches(r.Who, p, role) {
			continue
		}
		return RefDecision{Allowed: r.Allow, Rule: r}
	}
	return RefDecision{Allowed: role >= RoleWrite}
}

func hasOp(ops string, op RefOp) bool {
	for _, o := range strings.Split(ops, ",") {
		if RefOp(o) == op {
			return true
		}
	}
	return false
}

// whoMatches: "*" is everyone, "role:X" everyone whose role is at least X,
// anything else a user name.
func whoMatches(who string, p Principal, role Role) bool {
	if who == "*" {
		return true
	}
	if r, ok := strings.CutPrefix(who, "role:"); ok {
		want, err := ParseRole(r)
		return err == nil && role >= want
	}
	return !p.IsAnonymous() && who == p.User
}
