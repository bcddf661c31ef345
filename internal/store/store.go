// Package store is packwire's embedded database: one SQLite file in the data
// directory, opened in WAL mode so admin commands can write while the server
// reads. The schema moves forward through numbered migrations.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// ErrNotFound is returned when a looked-up row does not exist.
var ErrNotFound = errors.New("not found")

// ErrExists is returned when a unique name or key is taken.
var ErrExists = errors.New("already exists")

// Store wraps the database handle.
type Store struct {
	DB      *DB
	version versionWatch // Version's own connection
}

// migrations are applied in order; PRAGMA user_version records how many ran.
var migrations = []string{
	`CREATE TABLE users (
		id      INTEGER PRIMARY KEY,
		name    TEXT NOT NULL UNIQUE,
		created INTEGER NOT NULL
	);
	CREATE TABLE ssh_keys (
		fingerprint TEXT PRIMARY KEY,
		user_id     INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
		public_key  TEXT NOT NULL,
		comment     TEXT NOT NULL DEFAULT '',
		created     INTEGER NOT NULL
	);
	CREATE TABLE tokens (
		id       TEXT PRIMARY KEY,
		user_id  INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
		hash     BLOB NOT NULL,
		created  INTEGER NOT NULL,
		expires  INTEGER,
		revoked  INTEGER
	);`,
	// 2: the access model (issue 3): grants, anonymous-read settings, ref rules.
	`CREATE TABLE grants (
		user_id      INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
		repo_pattern TEXT NOT NULL,
		role         TEXT NOT NULL,
		created      INTEGER NOT NULL,
		PRIMARY KEY (user_id, repo_pattern)
	);
	CREATE TABLE settings (
		key   TEXT PRIMARY KEY,
		value TEXT NOT NULL
	);
	CREATE TABLE anonymous_read (
		repo_pattern TEXT PRIMARY KEY,
		enabled      INTEGER NOT NULL
	);
	CREATE TABLE ref_rules (
		id           INTEGER PRIMARY KEY,
		position     INTEGER NOT NULL,
		allow        INTEGER NOT NULL,
		ops          TEXT NOT NULL,
		repo_pattern TEXT NOT NULL,
		ref_pattern  TEXT NOT NULL,
		who          TEXT NOT NULL
	);`,
	// 3: a token's scope: "" (whatever its user may) or "metrics" (/metrics
	// only, for a Prometheus server's configuration).
	`ALTER TABLE tokens ADD COLUMN scope TEXT NOT NULL DEFAULT '';`,
	// 4: the audit log: every change to the access model and the
	// repositories, who made it and when (audit.go).
	`CREATE TABLE audit (
		id     INTEGER PRIMARY KEY,
		at     INTEGER NOT NULL, -- unix nanoseconds
		actor  TEXT NOT NULL,
		action TEXT NOT NULL,
		target TEXT NOT NULL,
		detail TEXT NOT NULL DEFAULT ''
	);`,
	// 5: webhooks and the outbox of deliveries (webhooks, push mirrors)
	// with every attempt (outbox.go).
	outboxMigration,
	// 6: the cluster (internal/server/cluster, PostgreSQL only in use):
	// nodes and their heartbeats (PostgreSQL's clock), where each
	// repository lives, its primary and generation, each replica's
	// generation (-1: not yet on its node).
	`CREATE TABLE nodes (
		name         TEXT PRIMARY KEY,
		url          TEXT NOT NULL,
		listeners    TEXT NOT NULL DEFAULT '',
		started_ms   INTEGER NOT NULL,
		heartbeat_ms INTEGER NOT NULL
	);
	CREATE TABLE cluster_repos (
		name         TEXT PRIMARY KEY,
		primary_node TEXT NOT NULL REFERENCES nodes(name),
		generation   INTEGER NOT NULL DEFAULT 0,
		epoch        INTEGER NOT NULL DEFAULT 0,
		created_ms   INTEGER NOT NULL,
		committed_ms INTEGER NOT NULL DEFAULT 0, -- the last generation's commit
		source       TEXT NOT NULL DEFAULT ''     -- repo import: where the primary imports it from
	);
	CREATE TABLE replicas (
		repo       TEXT NOT NULL REFERENCES cluster_repos(name) ON DELETE CASCADE,
		node       TEXT NOT NULL REFERENCES nodes(name),
		generation INTEGER NOT NULL DEFAULT -1,
		PRIMARY KEY (repo, node)
	);
	CREATE INDEX replicas_node ON replicas(node);`,
	// 7: repositories deleted from the cluster that a node still has to
	// move into its trash (cluster.Delete); a repository's settings that
	// live in git's files (HEAD's branch, the description, the quota), numbered, and
	// the number each copy applied (cluster.SetSettings).
	`CREATE TABLE cluster_deletions (
		repo       TEXT NOT NULL,
		node       TEXT NOT NULL,
		deleted_ms INTEGER NOT NULL,
		PRIMARY KEY (repo, node)
	);
	ALTER TABLE cluster_repos ADD COLUMN head TEXT NOT NULL DEFAULT '';
	ALTER TABLE cluster_repos ADD COLUMN description TEXT;
	ALTER TABLE cluster_repos ADD COLUMN quota INTEGER;
	ALTER TABLE cluster_repos ADD COLUMN settings INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE replicas ADD COLUMN settings INTEGER NOT NULL DEFAULT 0;`,
	// 8: repositories renamed in the cluster whose copy a node still has
	// to move to the new name (cluster.Rename), in the order they came;
	// deleted repositories' copies in the nodes' trash, to restore.
	`CREATE TABLE cluster_renames (
		id         INTEGER PRIMARY KEY,
		from_name  TEXT NOT NULL,
		to_name    TEXT NOT NULL,
		node       TEXT NOT NULL,
		renamed_ms INTEGER NOT NULL
	);
	CREATE INDEX cluster_renames_node ON cluster_renames(node);
	-- What a deleted repository's copy held (cluster.Restore): a deletion
	-- in progress notes it, and each node's copy in its trash keeps it,
	-- with the stamp of that node's trash entry.
	ALTER TABLE cluster_deletions ADD COLUMN generation INTEGER NOT NULL DEFAULT -1;
	ALTER TABLE cluster_deletions ADD COLUMN was_primary INTEGER NOT NULL DEFAULT 0;
	CREATE TABLE cluster_trash (
		repo        TEXT NOT NULL,
		node        TEXT NOT NULL,
		stamp       TEXT NOT NULL,
		deleted_ms  INTEGER NOT NULL, -- the deletion's: the same on every copy
		generation  INTEGER NOT NULL,
		was_primary INTEGER NOT NULL,
		PRIMARY KEY (repo, node, stamp)
	);
	-- Copies a node still has to bring back from its trash (cluster.Restore).
	CREATE TABLE cluster_restores (
		repo  TEXT NOT NULL,
		node  TEXT NOT NULL,
		stamp TEXT NOT NULL,
		PRIMARY KEY (repo, node)
	);`,
	// 9: what Version reads on PostgreSQL, where other nodes write too:
	// one row whose number a trigger on every table that decides access
	// moves, in the writing transaction itself (so it commits, or not,
	// with the change). SQLite has the table but needs no trigger
	// (PRAGMA data_version).
	`CREATE TABLE access_version (
		id      INTEGER PRIMARY KEY,
		version INTEGER NOT NULL
	);
	INSERT INTO access_version(id, version) VALUES(1, 0);` + postgresOnly + `
	CREATE FUNCTION packwire_access_changed() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		UPDATE access_version SET version = version + 1 WHERE id = 1;
		RETURN NULL;
	END $$;` + accessTriggers("users", "ssh_keys", "tokens", "grants", "settings", "anonymous_read", "ref_rules"),
	// 10: a cluster repository's mirroring with its credentials (a
	// mirror.Spec as JSON; NULL: none set), one of its numbered settings;
	// a deleted repository's settings kept with its copies in the trash,
	// for a restore.
	`ALTER TABLE cluster_repos ADD COLUMN mirror TEXT;
	ALTER TABLE cluster_deletions ADD COLUMN head TEXT NOT NULL DEFAULT '';
	ALTER TABLE cluster_deletions ADD COLUMN description TEXT;
	ALTER TABLE cluster_deletions ADD COLUMN quota INTEGER;
	ALTER TABLE cluster_deletions ADD COLUMN mirror TEXT;
	ALTER TABLE cluster_trash ADD COLUMN head TEXT NOT NULL DEFAULT '';
	ALTER TABLE cluster_trash ADD COLUMN description TEXT;
	ALTER TABLE cluster_trash ADD COLUMN quota INTEGER;
	ALTER TABLE cluster_trash ADD COLUMN mirror TEXT;`,
	// 11: copies a node holds that the cluster dropped (cluster move,
	// evacuate): the node moves each into its own trash.
	`CREATE TABLE cluster_dropped (
		repo TEXT NOT NULL,
		node TEXT NOT NULL,
		PRIMARY KEY (repo, node)
	);`,
	// 12: hook ids are never reused (PostgreSQL's identity column never
	// did): a new hook taking a removed one's id would show its deliveries.
	hookIDsMigration,
	// 13: the digest of a cluster repository's ref set (cluster.RefDigest)
	// and the generation it is of, written with the generation: a copy is
	// recorded at a generation only when its own refs have that digest.
	// Known only while digest_generation is the row's generation: NULL
	// (a row from before, a restore), or a generation a node without
	// digests committed since, is not known; the next push writes it.
	`ALTER TABLE cluster_repos ADD COLUMN digest TEXT;
	ALTER TABLE cluster_repos ADD COLUMN digest_generation INTEGER;`,
	// 14: a repository's push turn (cluster.BeginPush), a lease in
	// PostgreSQL's clock instead of a row lock held across the
	// replication: push_turn numbers the claims, push_holder is the node
	// holding the turn ('': none), push_until_ms when it lapses.
	`ALTER TABLE cluster_repos ADD COLUMN push_turn INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE cluster_repos ADD COLUMN push_holder TEXT NOT NULL DEFAULT '';
	ALTER TABLE cluster_repos ADD COLUMN push_until_ms INTEGER NOT NULL DEFAULT 0;`,
	// 15: the peers a node has not reached for a node timeout, as it
	// reports them in its heartbeat (",b,c,"; '': it reaches every one,
	// or does not tell): the monitor moves a primary that cannot reach a
	// majority of a repository's copies (cluster.Failover).
	`ALTER TABLE nodes ADD COLUMN unreached TEXT NOT NULL DEFAULT '';`,
}

// postgresOnly splits a migration: what follows it is applied on
// PostgreSQL only (Engine.ddl), where the two engines' dialects differ
// (triggers). sqliteOnly, before it, starts a part applied on SQLite only.
const (
	postgresOnly = "\n-- PostgreSQL only:\n"
	sqliteOnly   = "\n-- SQLite only:\n"
)

// accessTriggers moves access_version on every statement that writes one
// of tables (truncation included; a cascade from users writes the others).
func accessTriggers(tables ...string) string {
	var b strings.Builder
	for _, t := range tables {
		fmt.Fprintf(&b, "\n\tCREATE TRIGGER %s_access_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION packwire_access_changed();", t, t)
	}
	return b.String()
}

// Open opens (creating if needed) packwire's main database at path
// (users, keys, tokens, access rules) and migrates it.
func Open(ctx context.Context, path string) (*Store, error) {
	return OpenWith(ctx, path, migrations)
}

// OpenWith opens a SQLite database with the same settings and applies the
// given migrations. Other concerns with their own write load (request
// records) keep their own file, so they never contend with admin writes.
func OpenWith(ctx context.Context, path string, migrations []string) (*Store, error) {
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "foreign_keys(1)")
	q.Add("_pragma", "synchronous(NORMAL)")
	// Transactions that read and then write must hold the write lock from
	// the start: a deferred one that upgrades after another process wrote
	// fails with "database is locked" at once, without waiting.
	q.Add("_txlock", "immediate")
	if err := makePrivate(path); err != nil {
		return nil, fmt.Errorf("store %s: %w", path, err)
	}
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, err
	}
	s := &Store{DB: &DB{DB: db, Engine: SQLite}}
	if err := s.migrate(ctx, migrations); err != nil {
		db.Close()
		return nil, fmt.Errorf("store %s: %w", path, err)
	}
	return s, nil
}

// DefaultMaxConns bounds a PostgreSQL store's pool of connections unless
// SetMaxConns says otherwise (packwire serve --database-max-conns). Every
// node of a cluster and every admin command opens its own pool, and
// PostgreSQL refuses clients past its max_connections (100 by default):
// 16 leaves three nodes (21 each: 16, 4 for the request records, 1 for
// membership) and a dozen admin commands room under it. Requests queue
// for a connection past the bound instead of failing "too many clients".
const DefaultMaxConns = 16

// connMaxIdle closes a pooled PostgreSQL connection left idle this long:
// a bounded pool keeps every connection it opened (no reconnect per
// query under load), and a quiet node gives them back.
const connMaxIdle = time.Minute

// OpenPostgres opens packwire's main database in PostgreSQL (a cluster's
// shared state) and brings its schema up to date: the same migrations as
// SQLite's, adapted (DB.ddl). Its pool holds at most DefaultMaxConns
// connections (SetMaxConns).
func OpenPostgres(ctx context.Context, databaseURL string) (*Store, error) {
	s, err := OpenPostgresSchema(ctx, databaseURL, "", migrations)
	if err == nil {
		s.version.table = true
	}
	return s, err
}

// OpenPostgresSchema opens a PostgreSQL database whose tables live in
// their own schema (namespace), created if missing, with migrations
// numbered apart from the main store's (a schema_version table of its
// own): what OpenWith is to SQLite, for a concern that keeps its own
// tables (the governor's records). Every connection's search_path is that
// schema alone, so the queries name tables as they do in SQLite. "" is
// the database's default schema (public).
func OpenPostgresSchema(ctx context.Context, databaseURL, schema string, migrations []string) (*Store, error) {
	db, err := OpenPostgresPool(databaseURL, schema, DefaultMaxConns)
	if err != nil {
		return nil, err
	}
	s := &Store{DB: db}
	if err := s.migratePostgres(ctx, schema, migrations); err != nil {
		db.Close()
		return nil, fmt.Errorf("store %s: %w", RedactDatabaseURL(databaseURL), err)
	}
	return s, nil
}

// OpenPostgresPool opens a pool of at most maxConns connections (<= 0:
// DefaultMaxConns) to the PostgreSQL database at databaseURL, in schema
// ("": the default), without touching the schema: a pool apart from a
// store's for work that must never wait behind its requests (a cluster
// node's heartbeat). database/sql replaces a connection found broken (a
// PostgreSQL restart) by itself. Every session is bounded (sessionBounds,
// a connect timeout, TCP keepalives).
func OpenPostgresPool(databaseURL, schema string, maxConns int) (*DB, error) {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("store %s: %w", RedactDatabaseURL(databaseURL), err)
	}
	if schema != "" {
		cfg.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize()
	}
	boundSessions(cfg)
	d := &DB{DB: stdlib.OpenDB(*cfg), Engine: Postgres}
	d.SetMaxConns(maxConns)
	return d, nil
}

// SetMaxConns bounds the connections a PostgreSQL pool opens (n <= 0:
// DefaultMaxConns); a caller past the bound waits for one to be given
// back, within its context. It keeps as many idle, for at most
// connMaxIdle each. SQLite's pool is left as it is.
func (d *DB) SetMaxConns(n int) {
	if d.Engine != Postgres {
		return
	}
	if n <= 0 {
		n = DefaultMaxConns
	}
	d.SetMaxOpenConns(n)
	d.SetMaxIdleConns(n)
	d.SetConnMaxIdleTime(connMaxIdle)
}

// RedactDatabaseURL is a database URL fit for messages: no password.
func RedactDatabaseURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable database URL)"
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	q := u.Query()
	if q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// migratePostgres applies the migrations not yet applied, in one
// transaction under an advisory lock, so that nodes starting together
// apply each once; PostgreSQL's DDL is transactional, so a failed
// migration leaves the schema as it was.
func (s *Store) migratePostgres(ctx context.Context, schema string, migrations []string) error {
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	// Unbounded here: nodes starting together wait for the one migrating,
	// and a migration may rewrite a large table.
	for _, q := range []string{"SET LOCAL lock_timeout = 0", "SET LOCAL statement_timeout = 0"} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	// 0x7061636b77697265: "packwire".
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock(8097880775658320485)"); err != nil {
		return err
	}
	if schema != "" {
		// Created only when missing: CREATE SCHEMA IF NOT EXISTS would
		// still want the CREATE privilege on the database, which a role
		// given a schema made by an administrator may lack.
		var n int
		if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM pg_namespace WHERE nspname = ?", schema).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			if _, err := tx.ExecContext(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
				return fmt.Errorf("creating schema %s: %w", schema, err)
			}
		}
	}
	if _, err := tx.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)"); err != nil {
		return err
	}
	var version int
	err = tx.QueryRowContext(ctx, "SELECT version FROM schema_version").Scan(&version)
	if errors.Is(err, sql.ErrNoRows) {
		if _, err = tx.ExecContext(ctx, "INSERT INTO schema_version(version) VALUES(0)"); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	if version > len(migrations) {
		return fmt.Errorf("the database's schema (version %d) is newer than this packwire's (%d): upgrade packwire", version, len(migrations))
	}
	for i := version; i < len(migrations); i++ {
		q := Postgres.ddl(migrations[i])
		if strings.TrimSpace(q) == "" {
			continue // SQLite's alone
		}
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("migration %d: %w", i+1, err)
		}
	}
	if _, err := tx.ExecContext(ctx, "UPDATE schema_version SET version = ?", len(migrations)); err != nil {
		return err
	}
	return tx.Commit()
}

// Close closes the database.
func (s *Store) Close() error {
	s.closeVersion()
	return s.DB.Close()
}

func (s *Store) migrate(ctx context.Context, migrations []string) error {
	conn, err := s.DB.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	// BEGIN IMMEDIATE serialises concurrent first starts (server and CLI).
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return err
	}
	var version int
	if err := conn.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		conn.ExecContext(ctx, "ROLLBACK")
		return err
	}
	for i := version; i < len(migrations); i++ {
		if _, err := conn.ExecContext(ctx, SQLite.ddl(migrations[i])); err != nil {
			conn.ExecContext(ctx, "ROLLBACK")
			return fmt.Errorf("migration %d: %w", i+1, err)
		}
	}
	if version < len(migrations) {
		if _, err := conn.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", len(migrations))); err != nil {
			conn.ExecContext(ctx, "ROLLBACK")
			return err
		}
	}
	_, err = conn.ExecContext(ctx, "COMMIT")
	return err
}

func now() int64 { return time.Now().Unix() }
