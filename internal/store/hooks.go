package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// Hook is a webhook: packwire POSTs a JSON payload to URL for each event
// in Events on a repository RepoPattern matches. Secret signs the body
// (HMAC-SHA256); it is stored in clear because signing needs it, and is
// never printed back.
type Hook struct {
	ID          int64
	RepoPattern string
	URL         string
	Secret      string
	Events      []string
	Created     time.Time
}

// AddHook stores a webhook and returns its id.
// The audit log records it with the URL's credentials and query left out.
func (s *Store) AddHook(ctx context.Context, h Hook) (id int64, err error) {
	detail := fmt.Sprintf("%s -> %s, events %s", h.RepoPattern, urlWithoutSecrets(h.URL), strings.Join(h.Events, ","))
	err = s.change(ctx, "hook add", h.RepoPattern, detail, func(tx *Tx) error {
		return tx.QueryRowContext(ctx, "INSERT INTO hooks(repo_pattern, url, secret, events, created) VALUES(?, ?, ?, ?, ?) RETURNING id",
			h.RepoPattern, h.URL, h.Secret, strings.Join(h.Events, ","), now()).Scan(&id)
	})
	return id, err
}

// urlWithoutSecrets is a webhook URL as the audit log may show it: no
// user, password or query (where tokens are often passed).
func urlWithoutSecrets(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	return u.String()
}

// Hooks returns every webhook by id. Pushes read it (a handful of rows):
// patterns are matched in Go, as access patterns are.
func (s *Store) Hooks(ctx context.Context) ([]Hook, error) {
	rows, err := s.DB.QueryContext(ctx, "SELECT id, repo_pattern, url, secret, events, created FROM hooks ORDER BY id")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var hs []Hook
	for rows.Next() {
		h, err := scanHook(rows)
		if err != nil {
			return nil, err
		}
		hs = append(hs, h)
	}
	return hs, rows.Err()
}

// GetHook returns one webhook, or ErrNotFound.
func (s *Store) GetHook(ctx context.Context, id int64) (Hook, error) {
	h, err := scanHook(s.DB.QueryRowContext(ctx, "SELECT id, repo_pattern, url, secret, events, created FROM hooks WHERE id = ?", id))
	if errors.Is(err, sql.ErrNoRows) {
		return Hook{}, fmt.Errorf("hook %d: %w", id, ErrNotFound)
	}
	return h, err
}

func scanHook(row interface{ Scan(...any) error }) (Hook, error) {
	var h Hook
	var events string
	var created int64
	if err := row.Scan(&h.ID, &h.RepoPattern, &h.URL, &h.Secret, &events, &created); err != nil {
		return Hook{}, err
	}
	if events != "" {
		h.Events = strings.Split(events, ",")
	}
	h.Created = time.Unix(created, 0)
	return h, nil
}

// RemoveHook deletes a webhook; its deliveries still pending are given up
// (the history of the others stays until it ages out).
func (s *Store) RemoveHook(ctx context.Context, id int64) error {
	h, err := s.GetHook(ctx, id)
	if err != nil {
		return err
	}
	return s.change(ctx, "hook remove", h.RepoPattern, fmt.Sprintf("hook %d: %s", id, urlWithoutSecrets(h.URL)), func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, "DELETE FROM hooks WHERE id = ?", id)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("hook %d: %w", id, ErrNotFound)
		}
		return abandon(ctx, tx, KindWebhook, fmt.Sprint(id), "hook removed")
	})
}
