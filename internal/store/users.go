package store

import (
	"context"
	"database/sql"
	"errors"
	"time"
)

// User is a registered principal.
type User struct {
	ID      int64
	Name    string
	Created time.Time
}

// Key is a registered SSH public key.
type Key struct {
	Fingerprint string // SHA256:... as ssh-keygen -l prints it
	User        string
	PublicKey   string // authorized_keys format
	Comment     string
}

// Token is an HTTP token's stored form: never the secret, only its hash.
type Token struct {
	ID      string
	User    string
	Hash    []byte
	Created time.Time
	Expires time.Time // zero: never
	Revoked time.Time // zero: not revoked
	Scope   string    // "": the user's; ScopeMetrics: /metrics only
}

// ScopeMetrics is the scope of a token good for /metrics and nothing else.
const ScopeMetrics = "metrics"

// AddUser registers a user.
func (s *Store) AddUser(ctx context.Context, name string) (User, error) {
	var id int64
	err := s.change(ctx, "user add", name, "", func(tx *Tx) error {
		err := tx.QueryRowContext(ctx, "INSERT INTO users(name, created) VALUES(?, ?) RETURNING id", name, now()).Scan(&id)
		if isUnique(err) {
			return ErrExists
		}
		return err
	})
	if err != nil {
		return User{}, err
	}
	return User{ID: id, Name: name, Created: time.Now()}, nil
}

// RemoveUser deletes a user with their keys and tokens.
func (s *Store) RemoveUser(ctx context.Context, name string) error {
	return s.change(ctx, "user remove", name, "with their keys, tokens and grants", func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, "DELETE FROM users WHERE name = ?", name)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return ErrNotFound
		}
		return nil
	})
}

// GetUser looks a user up by name.
func (s *Store) GetUser(ctx context.Context, name string) (User, error) {
	var u User
	var created int64
	err := s.DB.QueryRowContext(ctx, "SELECT id, name, created FROM users WHERE name = ?", name).Scan(&u.ID, &u.Name, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return User{}, ErrNotFound
	}
	u.Created = time.Unix(created, 0)
	return u, err
}

// ListUsers returns every user by name.
func (s *Store) ListUsers(ctx context.Context) ([]User, error) {
	rows, err := s.DB.QueryContext(ctx, "SELECT id, name, created FROM users ORDER BY name")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var users []User
	for rows.Next() {
		var u User
		var created int64
		if err := rows.Scan(&u.ID, &u.Name, &created); err != nil {
			return nil, err
		}
		u.Created = time.Unix(created, 0)
		users = append(users, u)
	}
	return users, rows.Err()
}

// AddKey registers an SSH public key for a user. A key belongs to one user.
func (s *Store) AddKey(ctx context.Context, user string, k Key) error {
	u, err := s.GetUser(ctx, user)
	if err != nil {
		return err
	}
	return s.change(ctx, "key add", user, k.Fingerprint, func(tx *Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO ssh_keys(fingerprint, user_id, public_key, comment, created) VALUES(?, ?, ?, ?, ?)",
			k.Fingerprint, u.ID, k.PublicKey, k.Comment, now())
		if isUnique(err) {
			return ErrExists
		}
		return err
	})
}

// KeyOwner returns the user a key fingerprint belongs to.
func (s *Store) KeyOwner(ctx context.Context, fingerprint string) (string, error) {
	var name string
	err := s.DB.QueryRowContext(ctx, "SELECT u.name FROM ssh_keys k JOIN users u ON u.id = k.user_id WHERE k.fingerprint = ?", fingerprint).Scan(&name)
	if errors.Is(err, sql.ErrNoRows) {
		return "", ErrNotFound
	}
	return name, err
}

// AddToken stores a token's hash, with its scope ("" or ScopeMetrics).
func (s *Store) AddToken(ctx context.Context, user, id string, hash []byte, expires time.Time, scope string) error {
	u, err := s.GetUser(ctx, user)
	if err != nil {
		return err
	}
	var exp any
	if !expires.IsZero() {
		exp = expires.Unix()
	}
	detail := "id " + id
	if scope != "" {
		detail += ", scope " + scope
	}
	if !expires.IsZero() {
		detail += ", expires " + expires.UTC().Format(time.RFC3339)
	}
	return s.change(ctx, "token create", user, detail, func(tx *Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO tokens(id, user_id, hash, created, expires, scope) VALUES(?, ?, ?, ?, ?, ?)", id, u.ID, hash, now(), exp, scope)
		return err
	})
}

// GetToken looks a token up by its public id.
func (s *Store) GetToken(ctx context.Context, id string) (Token, error) {
	var t Token
	var created int64
	var expires, revoked sql.NullInt64
	err := s.DB.QueryRowContext(ctx, `SELECT t.id, u.name, t.hash, t.created, t.expires, t.revoked, t.scope
		FROM tokens t JOIN users u ON u.id = t.user_id WHERE t.id = ?`, id).Scan(&t.ID, &t.User, &t.Hash, &created, &expires, &revoked, &t.Scope)
	if errors.Is(err, sql.ErrNoRows) {
		return Token{}, ErrNotFound
	}
	if err != nil {
		return Token{}, err
	}
	t.Created = time.Unix(created, 0)
	if expires.Valid {
		t.Expires = time.Unix(expires.Int64, 0)
	}
	if revoked.Valid {
		t.Revoked = time.Unix(revoked.Int64, 0)
	}
	return t, nil
}
