package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// actorKey carries who makes a change through a context.
type actorKey struct{}

// WithActor returns ctx saying who makes the changes done with it: "cli:root"
// for an admin command (the OS user), "dashboard:alice" for a web session.
func WithActor(ctx context.Context, actor string) context.Context {
	return context.WithValue(ctx, actorKey{}, actor)
}

// ActorOf is who ctx says makes its changes ("unknown" when none says).
func ActorOf(ctx context.Context) string {
	if a, ok := ctx.Value(actorKey{}).(string); ok && a != "" {
		return a
	}
	return "unknown"
}

// AuditEntry is one recorded change.
type AuditEntry struct {
	ID     int64     `json:"id"`
	At     time.Time `json:"at"`
	Actor  string    `json:"actor"`
	Action string    `json:"action"` // "user add", "grant", "repo delete", ...
	Target string    `json:"target"` // what it was done to: a user, a repository, a rule position
	Detail string    `json:"detail"` // the rest: a role and pattern, a fingerprint, a rule's text
}

// execer is a *sql.DB or a *Tx.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// audit records a change through x, the transaction that makes it when
// there is one, so that no change is kept without its record.
func audit(ctx context.Context, x execer, action, target, detail string) error {
	_, err := x.ExecContext(ctx, "INSERT INTO audit(at, actor, action, target, detail) VALUES(?, ?, ?, ?, ?)",
		time.Now().UnixNano(), ActorOf(ctx), action, target, detail)
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	return nil
}

// change runs fn and records it, in one transaction.
func (s *Store) change(ctx context.Context, action, target, detail string, fn func(tx *Tx) error) error {
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	if err := audit(ctx, tx, action, target, detail); err != nil {
		return err
	}
	return tx.Commit()
}

// RecordAudit records a change made outside the store (a repository
// created, renamed or deleted on disk; a webhook added).
func (s *Store) RecordAudit(ctx context.Context, action, target, detail string) error {
	return audit(ctx, s.DB, action, target, detail)
}

// Audit returns the latest recorded changes, newest first (limit <= 0: all).
func (s *Store) Audit(ctx context.Context, limit int) ([]AuditEntry, error) {
	q := "SELECT id, at, actor, action, target, detail FROM audit ORDER BY id DESC"
	args := []any{}
	if limit > 0 {
		q += " LIMIT ?"
		args = append(args, limit)
	}
	rows, err := s.DB.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []AuditEntry
	for rows.Next() {
		var e AuditEntry
		var at int64
		if err := rows.Scan(&e.ID, &at, &e.Actor, &e.Action, &e.Target, &e.Detail); err != nil {
			return nil, err
		}
		e.At = time.Unix(0, at)
		out = append(out, e)
	}
	return out, rows.Err()
}
