package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Grant gives a user a role on the repositories a pattern matches.
type Grant struct {
	User        string
	RepoPattern string
	Role        string // read, write or admin
}

// AnonRead is a per-repository-pattern override of the server-wide
// anonymous read switch.
type AnonRead struct {
	RepoPattern string
	Enabled     bool
}

// Rule is one ordered ref rule, gitolite style. Position is 1-based.
type Rule struct {
	Position    int
	Allow       bool
	Ops         string // comma separated: create,push,force-push,delete
	RepoPattern string
	RefPattern  string
	Who         string // a user name, role:read|write|admin, or *
}

// SetGrant gives user role on pattern, replacing an earlier grant on the
// same pattern.
func (s *Store) SetGrant(ctx context.Context, g Grant) error {
	u, err := s.GetUser(ctx, g.User)
	if err != nil {
		return err
	}
	return s.change(ctx, "grant", g.User, g.Role+" on "+g.RepoPattern, func(tx *Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO grants(user_id, repo_pattern, role, created) VALUES(?, ?, ?, ?)
		ON CONFLICT(user_id, repo_pattern) DO UPDATE SET role = excluded.role`, u.ID, g.RepoPattern, g.Role, now())
		return err
	})
}

// RemoveGrant removes user's grant on exactly pattern.
func (s *Store) RemoveGrant(ctx context.Context, user, pattern string) error {
	return s.change(ctx, "revoke", user, "grant on "+pattern, func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM grants WHERE repo_pattern = ? AND user_id = (SELECT id FROM users WHERE name = ?)`, pattern, user)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return ErrNotFound
		}
		return nil
	})
}

// Grants returns the grants of user, or every grant if user is empty.
func (s *Store) Grants(ctx context.Context, user string) ([]Grant, error) {
	q := `SELECT u.name, g.repo_pattern, g.role FROM grants g JOIN users u ON u.id = g.user_id`
	var args []any
	if user != "" {
		q += ` WHERE u.name = ?`
		args = append(args, user)
	}
	rows, err := s.DB.QueryContext(ctx, q+` ORDER BY u.name, g.repo_pattern`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var gs []Grant
	for rows.Next() {
		var g Grant
		if err := rows.Scan(&g.User, &g.RepoPattern, &g.Role); err != nil {
			return nil, err
		}
		gs = append(gs, g)
	}
	return gs, rows.Err()
}

// Setting returns a server-wide setting, or def if it was never set.
func (s *Store) Setting(ctx context.Context, key, def string) (string, error) {
	var v string
	err := s.DB.QueryRowContext(ctx, "SELECT value FROM settings WHERE key = ?", key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return def, nil
	}
	return v, err
}

// SetSetting stores a server-wide setting.
func (s *Store) SetSetting(ctx context.Context, key, value string) error {
	return s.change(ctx, "setting", key, value, func(tx *Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO settings(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value", key, value)
		return err
	})
}

// SetAnonRead sets the anonymous read override of a repository pattern.
func (s *Store) SetAnonRead(ctx context.Context, a AnonRead) error {
	onOff := "off"
	if a.Enabled {
		onOff = "on"
	}
	return s.change(ctx, "anonymous-read", a.RepoPattern, onOff, func(tx *Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO anonymous_read(repo_pattern, enabled) VALUES(?, ?) ON CONFLICT(repo_pattern) DO UPDATE SET enabled = excluded.enabled", a.RepoPattern, a.Enabled)
		return err
	})
}

// AnonReads returns every per-pattern anonymous read override.
func (s *Store) AnonReads(ctx context.Context) ([]AnonRead, error) {
	rows, err := s.DB.QueryContext(ctx, "SELECT repo_pattern, enabled FROM anonymous_read ORDER BY repo_pattern")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var as []AnonRead
	for rows.Next() {
		var a AnonRead
		if err := rows.Scan(&a.RepoPattern, &a.Enabled); err != nil {
			return nil, err
		}
		as = append(as, a)
	}
	return as, rows.Err()
}

// Rules returns the ref rules in evaluation order.
func (s *Store) Rules(ctx context.Context) ([]Rule, error) {
	rows, err := s.DB.QueryContext(ctx, "SELECT allow, ops, repo_pattern, ref_pattern, who FROM ref_rules ORDER BY position, id")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var rs []Rule
	for rows.Next() {
		var r Rule
		if err := rows.Scan(&r.Allow, &r.Ops, &r.RepoPattern, &r.RefPattern, &r.Who); err != nil {
			return nil, err
		}
		r.Position = len(rs) + 1
		rs = append(rs, r)
	}
	return rs, rows.Err()
}

// InsertRules inserts rules at 1-based position pos (0 or past the end:
// append), in the order given, shifting the rules after them.
func (s *Store) InsertRules(ctx context.Context, pos int, rules ...Rule) (int, error) {
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	var n int
	if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM ref_rules").Scan(&n); err != nil {
		return 0, err
	}
	if err := renumber(ctx, tx); err != nil {
		return 0, err
	}
	if pos <= 0 || pos > n+1 {
		pos = n + 1
	}
	if _, err := tx.ExecContext(ctx, "UPDATE ref_rules SET position = position + ? WHERE position >= ?", len(rules), pos); err != nil {
		return 0, err
	}
	for i, r := range rules {
		if _, err := tx.ExecContext(ctx, "INSERT INTO ref_rules(position, allow, ops, repo_pattern, ref_pattern, who) VALUES(?, ?, ?, ?, ?, ?)",
			pos+i, r.Allow, r.Ops, r.RepoPattern, r.RefPattern, r.Who); err != nil {
			return 0, err
		}
		if err := audit(ctx, tx, "rule add", fmt.Sprintf("#%d", pos+i), RuleText(r)); err != nil {
			return 0, err
		}
	}
	return pos, tx.Commit()
}

// RemoveRule removes the rule at 1-based position pos.
func (s *Store) RemoveRule(ctx context.Context, pos int) (Rule, error) {
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return Rule{}, err
	}
	defer tx.Rollback()
	if err := renumber(ctx, tx); err != nil {
		return Rule{}, err
	}
	r := Rule{Position: pos}
	err = tx.QueryRowContext(ctx, "SELECT allow, ops, repo_pattern, ref_pattern, who FROM ref_rules WHERE position = ?", pos).
		Scan(&r.Allow, &r.Ops, &r.RepoPattern, &r.RefPattern, &r.Who)
	if errors.Is(err, sql.ErrNoRows) {
		return Rule{}, ErrNotFound
	}
	if err != nil {
		return Rule{}, err
	}
	if _, err := tx.ExecContext(ctx, "DELETE FROM ref_rules WHERE position = ?", pos); err != nil {
		return Rule{}, err
	}
	if err := audit(ctx, tx, "rule remove", fmt.Sprintf("#%d", pos), RuleText(r)); err != nil {
		return Rule{}, err
	}
	if err := renumber(ctx, tx); err != nil {
		return Rule{}, err
	}
	return r, tx.Commit()
}

// renumber makes positions 1..n in the current order. (One UPDATE with a
// counting subquery would see its own earlier writes: done row by row.)
func renumber(ctx context.Context, tx *Tx) error {
	rows, err := tx.QueryContext(ctx, "SELECT id FROM ref_rules ORDER BY position, id")
	if err != nil {
		return err
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return err
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for i, id := range ids {
		if _, err := tx.ExecContext(ctx, "UPDATE ref_rules SET position = ? WHERE id = ?", i+1, id); err != nil {
			return err
		}
	}
	return nil
}

// RemoveKey removes an SSH key by fingerprint and returns its owner.
func (s *Store) RemoveKey(ctx context.Context, fingerprint string) (string, error) {
	owner, err := s.KeyOwner(ctx, fingerprint)
	if err != nil {
		return "", err
	}
	return owner, s.change(ctx, "key remove", owner, fingerprint, func(tx *Tx) error {
		_, err := tx.ExecContext(ctx, "DELETE FROM ssh_keys WHERE fingerprint = ?", fingerprint)
		return err
	})
}

// Keys returns the keys of user, or every key if user is empty.
func (s *Store) Keys(ctx context.Context, user string) ([]Key, error) {
	q := "SELECT k.fingerprint, u.name, k.public_key, k.comment FROM ssh_keys k JOIN users u ON u.id = k.user_id"
	var args []any
	if user != "" {
		q += " WHERE u.name = ?"
		args = append(args, user)
	}
	rows, err := s.DB.QueryContext(ctx, q+" ORDER BY u.name, k.created, k.fingerprint", args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ks []Key
	for rows.Next() {
		var k Key
		if err := rows.Scan(&k.Fingerprint, &k.User, &k.PublicKey, &k.Comment); err != nil {
			return nil, err
		}
		ks = append(ks, k)
	}
	return ks, rows.Err()
}

// Tokens returns every token's metadata (never usable as a credential:
// the hash is left out).
func (s *Store) Tokens(ctx context.Context) ([]Token, error) {
	rows, err := s.DB.QueryContext(ctx, `SELECT t.id, u.name, t.created, t.expires, t.revoked, t.scope
		FROM tokens t JOIN users u ON u.id = t.user_id ORDER BY u.name, t.created, t.id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ts []Token
	for rows.Next() {
		var t Token
		var created int64
		var expires, revoked sql.NullInt64
		if err := rows.Scan(&t.ID, &t.User, &created, &expires, &revoked, &t.Scope); err != nil {
			return nil, err
		}
		t.Created = time.Unix(created, 0)
		if expires.Valid {
			t.Expires = time.Unix(expires.Int64, 0)
		}
		if revoked.Valid {
			t.Revoked = time.Unix(revoked.Int64, 0)
		}
		ts = append(ts, t)
	}
	return ts, rows.Err()
}

// TokenExpiryGrace is how long an expired token stays listed before
// DeleteExpiredTokens removes it: long enough for an admin to see why a
// client's token stopped working, short enough that git-lfs-authenticate's
// 15-minute tokens (one per SSH LFS operation) do not pile up.
const TokenExpiryGrace = 24 * time.Hour

// DeleteExpiredTokens removes the tokens that expired before cutoff (an
// expired token is refused already; its row only fills the table) and
// says how many, in one audit entry.
func (s *Store) DeleteExpiredTokens(ctx context.Context, cutoff time.Time) (int64, error) {
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, "DELETE FROM tokens WHERE expires IS NOT NULL AND expires < ?", cutoff.Unix())
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if err != nil || n == 0 {
		return 0, err // nothing removed: no audit entry every maintenance turn
	}
	if err := audit(ctx, tx, "token expire", "", fmt.Sprintf("%d tokens expired before %s", n, cutoff.UTC().Format(time.RFC3339))); err != nil {
		return 0, err
	}
	return n, tx.Commit()
}

// RevokeToken marks a token revoked; it stays listed.
func (s *Store) RevokeToken(ctx context.Context, id string) error {
	return s.change(ctx, "token revoke", id, "", func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, "UPDATE tokens SET revoked = COALESCE(revoked, ?) WHERE id = ?", now(), id)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("token %s: %w", id, ErrNotFound)
		}
		return nil
	})
}

// Model is the whole access model, for export and import. Tokens are
// metadata only: their hashes never leave the store.
type Model struct {
	AnonReadDefault string // "on" or "off"
	AnonReads       []AnonRead
	Users           []User
	Keys            []Key
	Grants          []Grant
	Rules           []Rule
	Tokens          []Token
}

// UsersRemovedError is ReplaceModel's refusal to remove users (and with
// them their keys, tokens and grants) it was not allowed to prune.
type UsersRemovedError struct {
	Users []string
}

func (e *UsersRemovedError) Error() string {
	return fmt.Sprintf("would remove users %s", strings.Join(e.Users, ", "))
}

// ReplaceModel makes the store hold exactly m (users, keys, grants, rules,
// anonymous read settings) in one transaction. Users that stay keep their
// tokens; users not in m are removed with theirs, only if prune: otherwise
// that is a *UsersRemovedError and nothing changes (decided inside the
// transaction, so a user added meanwhile is never removed unasked).
// m.Tokens is ignored: tokens cannot be imported, only revoked in place
// (see RevokeToken).
func (s *Store) ReplaceModel(ctx context.Context, m Model, prune bool) error {
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	exec := func(q string, args ...any) {
		if err == nil {
			_, err = tx.ExecContext(ctx, q, args...)
		}
	}
	exec("CREATE TEMP TABLE IF NOT EXISTS keep_users(name TEXT PRIMARY KEY)")
	exec("DELETE FROM keep_users")
	for _, u := range m.Users {
		exec("INSERT INTO keep_users(name) VALUES(?) ON CONFLICT(name) DO NOTHING", u.Name)
		exec("INSERT INTO users(name, created) VALUES(?, ?) ON CONFLICT(name) DO NOTHING", u.Name, now())
	}
	if err == nil && !prune {
		var removed []string
		if removed, err = usersNotKept(ctx, tx); err == nil && len(removed) > 0 {
			return &UsersRemovedError{Users: removed}
		}
	}
	exec("DELETE FROM users WHERE name NOT IN (SELECT name FROM keep_users)")
	exec("DELETE FROM ssh_keys")
	for _, k := range m.Keys {
		exec("INSERT INTO ssh_keys(fingerprint, user_id, public_key, comment, created) VALUES(?, (SELECT id FROM users WHERE name = ?), ?, ?, ?)",
			k.Fingerprint, k.User, k.PublicKey, k.Comment, now())
	}
	exec("DELETE FROM grants")
	for _, g := range m.Grants {
		exec("INSERT INTO grants(user_id, repo_pattern, role, created) VALUES((SELECT id FROM users WHERE name = ?), ?, ?, ?)", g.User, g.RepoPattern, g.Role, now())
	}
	exec("DELETE FROM ref_rules")
	for i, r := range m.Rules {
		exec("INSERT INTO ref_rules(position, allow, ops, repo_pattern, ref_pattern, who) VALUES(?, ?, ?, ?, ?, ?)", i+1, r.Allow, r.Ops, r.RepoPattern, r.RefPattern, r.Who)
	}
	exec("DELETE FROM anonymous_read")
	for _, a := range m.AnonReads {
		exec("INSERT INTO anonymous_read(repo_pattern, enabled) VALUES(?, ?)", a.RepoPattern, a.Enabled)
	}
	exec("INSERT INTO settings(key, value) VALUES('anonymous-read', ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value", m.AnonReadDefault)
	exec("DROP TABLE keep_users")
	if err == nil {
		err = audit(ctx, tx, "access import", "", fmt.Sprintf("%d users, %d keys, %d grants, %d rules, %d anonymous-read patterns (prune %v)",
			len(m.Users), len(m.Keys), len(m.Grants), len(m.Rules), len(m.AnonReads), prune))
	}
	if err != nil {
		if isUnique(err) {
			return fmt.Errorf("%w (a key listed twice, or a duplicate grant)", ErrExists)
		}
		return err
	}
	return tx.Commit()
}

func usersNotKept(ctx context.Context, tx *Tx) ([]string, error) {
	rows, err := tx.QueryContext(ctx, "SELECT name FROM users WHERE name NOT IN (SELECT name FROM keep_users) ORDER BY name")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		names = append(names, n)
	}
	return names, rows.Err()
}

// RuleText renders a rule as the CLI takes it, logs and the audit log show it.
func RuleText(r Rule) string {
	verb := "deny"
	if r.Allow {
		verb = "allow"
	}
	return fmt.Sprintf("%s %s %s %s %s", verb, r.Ops, r.RepoPattern, r.RefPattern, r.Who)
}
