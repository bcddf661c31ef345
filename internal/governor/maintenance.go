package governor

import (
	"context"
	"database/sql"
	"errors"
	"time"
)

// maintenanceMigration is the second migration: one row per maintenance
// run (internal/maintain), apart from the request records.
const maintenanceMigration = `
CREATE TABLE maintenance_runs (
	seq          INTEGER PRIMARY KEY,
	repo         TEXT NOT NULL,
	start_ns     INTEGER NOT NULL,
	wall_ns      INTEGER NOT NULL,
	cpu_user_ns  INTEGER NOT NULL,
	cpu_sys_ns   INTEGER NOT NULL,
	kind         TEXT NOT NULL,
	reason       TEXT NOT NULL,
	packs_before INTEGER NOT NULL,
	bytes_before INTEGER NOT NULL,
	packs_after  INTEGER NOT NULL,
	bytes_after  INTEGER NOT NULL,
	result       TEXT NOT NULL,
	error        TEXT NOT NULL
);
CREATE INDEX maintenance_runs_repo ON maintenance_runs(repo, start_ns);`

// MaintenanceRun is one run of repository maintenance.
type MaintenanceRun struct {
	Repo        string        `json:"repo"`
	Start       time.Time     `json:"start"`
	Wall        time.Duration `json:"wall_ns"`
	UserCPU     time.Duration `json:"cpu_user_ns"` // rusage of the git processes
	SysCPU      time.Duration `json:"cpu_sys_ns"`
	Kind        string        `json:"kind"`   // full, geometric
	Reason      string        `json:"reason"` // why the scheduler chose it
	PacksBefore int           `json:"packs_before"`
	BytesBefore int64         `json:"bytes_before"`
	PacksAfter  int           `json:"packs_after"`
	BytesAfter  int64         `json:"bytes_after"`
	Result      string        `json:"result"` // ok, error, killed
	Error       string        `json:"error,omitempty"`
	Node        string        `json:"node,omitempty"` // the cluster node whose copy it was (migration 5); empty: a single server
}

// RecordMaintenance stores one maintenance run at once (runs are rare). A
// run without a node is this server's (Options.Node, once started).
func (g *Governor) RecordMaintenance(ctx context.Context, r MaintenanceRun) error {
	if r.Node == "" {
		r.Node = g.opts.Node
	}
	_, err := g.db.DB.ExecContext(ctx, `INSERT INTO maintenance_runs (repo, start_ns, wall_ns, cpu_user_ns, cpu_sys_ns, kind, reason,
		packs_before, bytes_before, packs_after, bytes_after, result, error, node) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		r.Repo, r.Start.UnixNano(), int64(r.Wall), int64(r.UserCPU), int64(r.SysCPU), r.Kind, r.Reason,
		r.PacksBefore, r.BytesBefore, r.PacksAfter, r.BytesAfter, r.Result, r.Error, r.Node)
	return err
}

// LastMaintenance returns the newest maintenance runs of repo (all repos if
// repo is empty), newest first.
func (g *Governor) LastMaintenance(ctx context.Context, repo string, n int) ([]MaintenanceRun, error) {
	// Two statements, not "? = '' OR repo = ?": the OR keeps SQLite from
	// using the repo index, and the table is never trimmed.
	if repo == "" {
		return g.queryMaintenance(ctx, maintenanceColumns+` ORDER BY seq DESC LIMIT ?`, n)
	}
	return g.queryMaintenance(ctx, maintenanceColumns+` WHERE repo = ? ORDER BY seq DESC LIMIT ?`, repo, n)
}

// LatestMaintenance returns the newest run of every repository that had
// one, by repository name, in one query (the Repos page).
func (g *Governor) LatestMaintenance(ctx context.Context) (map[string]MaintenanceRun, error) {
	runs, err := g.queryMaintenance(ctx, maintenanceColumns+` WHERE seq IN (SELECT max(seq) FROM maintenance_runs GROUP BY repo)`)
	if err != nil {
		return nil, err
	}
	out := make(map[string]MaintenanceRun, len(runs))
	for _, r := range runs {
		out[r.Repo] = r
	}
	return out, nil
}

const maintenanceColumns = `SELECT repo, start_ns, wall_ns, cpu_user_ns, cpu_sys_ns, kind, reason, packs_before,
		bytes_before, packs_after, bytes_after, result, error, node FROM maintenance_runs`

func (g *Governor) queryMaintenance(ctx context.Context, query string, args ...any) ([]MaintenanceRun, error) {
	rows, err := g.db.DB.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []MaintenanceRun
	for rows.Next() {
		var r MaintenanceRun
		var start, wall, cu, cs int64
		if err := rows.Scan(&r.Repo, &start, &wall, &cu, &cs, &r.Kind, &r.Reason, &r.PacksBefore, &r.BytesBefore,
			&r.PacksAfter, &r.BytesAfter, &r.Result, &r.Error, &r.Node); err != nil {
			return nil, err
		}
		r.Start, r.Wall, r.UserCPU, r.SysCPU = time.Unix(0, start), time.Duration(wall), time.Duration(cu), time.Duration(cs)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, err
	}
	return out, nil
}
