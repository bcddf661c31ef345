package lfs

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"time"

	"packwire/internal/store"
)

// IndexFile is the index's file name under DATA/lfs.
const IndexFile = "lfs.db"

// indexMigrations: the index's own schema, numbered like the store's.
var indexMigrations = []string{
	// 1: which repository may serve which object (content is stored once
	// by oid; access is per repository), and the file locks.
	`CREATE TABLE lfs_objects (
		repo       TEXT NOT NULL,
		oid        TEXT NOT NULL,
		size       INTEGER NOT NULL,
		created_ms INTEGER NOT NULL,
		PRIMARY KEY (repo, oid)
	);
	CREATE INDEX lfs_objects_oid ON lfs_objects(oid);
	CREATE TABLE lfs_locks (
		id        INTEGER PRIMARY KEY,
		repo      TEXT NOT NULL,
		path      TEXT NOT NULL,
		owner     TEXT NOT NULL,
		locked_ms INTEGER NOT NULL,
		UNIQUE (repo, path)
	);`,
}

// PostgresSchema is the index's schema in a cluster's PostgreSQL database.
const PostgresSchema = "lfs"

// postgresIndexMigrations: the same tables in PostgreSQL, numbered apart
// (schema_version in PostgresSchema); sizes and times are 64-bit there.
var postgresIndexMigrations = []string{
	`CREATE TABLE lfs_objects (
		repo       TEXT NOT NULL,
		oid        TEXT NOT NULL,
		size       BIGINT NOT NULL,
		created_ms BIGINT NOT NULL,
		PRIMARY KEY (repo, oid)
	);
	CREATE INDEX lfs_objects_oid ON lfs_objects(oid);
	CREATE TABLE lfs_locks (
		id        BIGSERIAL PRIMARY KEY,
		repo      TEXT NOT NULL,
		path      TEXT NOT NULL,
		owner     TEXT NOT NULL,
		locked_ms BIGINT NOT NULL,
		UNIQUE (repo, path)
	);`,
}

// Index records which repository holds which object, and the locks.
type Index struct {
	st *store.Store
	// size is Size's query, prepared once: it runs for every object a
	// batch names and every download.
	size *sql.Stmt
}

// OpenIndex opens (creating) the index at path.
func OpenIndex(ctx context.Context, path string) (*Index, error) {
	st, err := store.OpenWith(ctx, path, indexMigrations)
	if err != nil {
		return nil, err
	}
	return newIndex(ctx, st)
}

// newIndex prepares the index's queries on st (SQLite or PostgreSQL: the
// store rewrites the placeholders), closing st if that fails.
func newIndex(ctx context.Context, st *store.Store) (*Index, error) {
	size, err := st.DB.PrepareContext(ctx, "SELECT size FROM lfs_objects WHERE repo = ? AND oid = ?")
	if err != nil {
		st.Close()
		return nil, err
	}
	return &Index{st: st, size: size}, nil
}

// OpenIndexPostgres opens (creating) the index a cluster's nodes share,
// in its own schema of the PostgreSQL database at databaseURL.
func OpenIndexPostgres(ctx context.Context, databaseURL string) (*Index, error) {
	st, err := store.OpenPostgresSchema(ctx, databaseURL, PostgresSchema, postgresIndexMigrations)
	if err != nil {
		return nil, err
	}
	return newIndex(ctx, st)
}

// Close closes the index.
func (x *Index) Close() error {
	x.size.Close()
	return x.st.Close()
}

// Add records that repo holds oid of size bytes.
func (x *Index) Add(ctx context.Context, repo, oid string, size int64) error {
	_, err := x.st.DB.ExecContext(ctx, "INSERT INTO lfs_objects(repo, oid, size, created_ms) VALUES(?, ?, ?, ?) ON CONFLICT DO NOTHING",
		repo, oid, size, time.Now().UnixMilli())
	return err
}

// Size returns the size repo holds oid at, or false if repo does not hold it.
func (x *Index) Size(ctx context.Context, repo, oid string) (int64, bool, error) {
	var size int64
	err := x.size.QueryRowContext(ctx, repo, oid).Scan(&size)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	return size, err == nil, err
}

// Usage is how many objects repo holds and their bytes.
func (x *Index) Usage(ctx context.Context, repo string) (objects, bytes int64, err error) {
	err = x.st.DB.QueryRowContext(ctx, "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM lfs_objects WHERE repo = ?", repo).Scan(&objects, &bytes)
	return objects, bytes, err
}

// Lock is one locked path of a repository.
type Lock struct {
	ID       string
	Repo     string
	Path     string
	Owner    string
	LockedAt time.Time
}

// ErrLockExists: the path is locked already (by the returned lock).
var ErrLockExists = errors.New("lock exists")

// CreateLock locks path in repo for owner, or returns the existing lock
// with ErrLockExists.
func (x *Index) CreateLock(ctx context.Context, repo, path, owner string) (Lock, error) {
	now := time.Now()
	res, err := x.st.DB.ExecContext(ctx, "INSERT INTO lfs_locks(repo, path, owner, locked_ms) VALUES(?, ?, ?, ?) ON CONFLICT DO NOTHING",
		repo, path, owner, now.UnixMilli())
	if err != nil {
		return Lock{}, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return Lock{}, err
	}
	locks, err := x.Locks(ctx, repo, LockFilter{Path: path})
	if err != nil {
		return Lock{}, err
	}
	if len(locks) == 0 {
		return Lock{}, errors.New("lock vanished as it was made")
	}
	if n == 0 {
		return locks[0], ErrLockExists
	}
	return locks[0], nil
}

// LockFilter narrows Locks: by path, by id, after a cursor (an id), at
// most Limit (0: all).
type LockFilter struct {
	Path, ID, Cursor string
	Limit            int
}

// Locks lists repo's locks in id order.
func (x *Index) Locks(ctx context.Context, repo string, f LockFilter) ([]Lock, error) {
	q := "SELECT id, repo, path, owner, locked_ms FROM lfs_locks WHERE repo = ?"
	args := []any{repo}
	if f.Path != "" {
		q += " AND path = ?"
		args = append(args, f.Path)
	}
	if f.ID != "" {
		id, err := strconv.ParseInt(f.ID, 10, 64)
		if err != nil {
			return nil, nil
		}
		q += " AND id = ?"
		args = append(args, id)
	}
	if f.Cursor != "" {
		c, err := strconv.ParseInt(f.Cursor, 10, 64)
		if err != nil {
			return nil, nil
		}
		q += " AND id >= ?"
		args = append(args, c)
	}
	q += " ORDER BY id"
	if f.Limit > 0 {
		q += " LIMIT " + strconv.Itoa(f.Limit)
	}
	rows, err := x.st.DB.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Lock
	for rows.Next() {
		var l Lock
		var id, ms int64
		if err := rows.Scan(&id, &l.Repo, &l.Path, &l.Owner, &ms); err != nil {
			return nil, err
		}
		l.ID, l.LockedAt = strconv.FormatInt(id, 10), time.UnixMilli(ms).UTC()
		out = append(out, l)
	}
	return out, rows.Err()
}

// DeleteLock removes the lock with id from repo.
func (x *Index) DeleteLock(ctx context.Context, repo, id string) error {
	n, err := strconv.ParseInt(id, 10, 64)
	if err != nil {
		return nil
	}
	_, err = x.st.DB.ExecContext(ctx, "DELETE FROM lfs_locks WHERE repo = ? AND id = ?", repo, n)
	return err
}

// RemoveRepo forgets repo's objects and locks (a deleted repository); the
// content stays until maintenance finds no repository holding it.
func (x *Index) RemoveRepo(ctx context.Context, repo string) error {
	if _, err := x.st.DB.ExecContext(ctx, "DELETE FROM lfs_objects WHERE repo = ?", repo); err != nil {
		return err
	}
	_, err := x.st.DB.ExecContext(ctx, "DELETE FROM lfs_locks WHERE repo = ?", repo)
	return err
}

// RenameRepo moves repo's objects and locks to its new name.
func (x *Index) RenameRepo(ctx context.Context, from, to string) error {
	if _, err := x.st.DB.ExecContext(ctx, "UPDATE lfs_objects SET repo = ? WHERE repo = ?", to, from); err != nil {
		return err
	}
	_, err := x.st.DB.ExecContext(ctx, "UPDATE lfs_locks SET repo = ? WHERE repo = ?", to, from)
	return err
}

// trashNames lists the trash names (trashName) that rows are kept under.
func (x *Index) trashNames(ctx context.Context) ([]string, error) {
	rows, err := x.st.DB.QueryContext(ctx, "SELECT DISTINCT repo FROM lfs_objects WHERE repo LIKE ? UNION SELECT DISTINCT repo FROM lfs_locks WHERE repo LIKE ?",
		trashPrefix+"%", trashPrefix+"%")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		out = append(out, name)
	}
	return out, rows.Err()
}

// Held reports whether any repository (or trash entry) holds oid.
func (x *Index) Held(ctx context.Context, oid string) (bool, error) {
	var one int
	err := x.st.DB.QueryRowContext(ctx, "SELECT 1 FROM lfs_objects WHERE oid = ? LIMIT 1", oid).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}
