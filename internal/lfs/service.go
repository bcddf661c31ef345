package lfs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"packwire/internal/access"
	"packwire/internal/governor"
	"packwire/internal/repo"
)

// Service is LFS for one data directory: what the HTTP API and the SSH
// commands share.
type Service struct {
	Repos   repo.Root
	Access  *access.Controller
	Objects Store
	Index   *Index
	// Dir is DATA/lfs: the disk store and the node's own index.
	Dir string
	// Database is the PostgreSQL URL of a cluster's shared index ("":
	// the index is under Dir), for the push check's hook.
	Database string
	// MaxObjectBytes bounds one object (0: no bound).
	MaxObjectBytes int64
	// HTTPURL is the base URL (scheme://host[:port]) HTTP clients reach
	// this server at, for the hrefs git-lfs-authenticate answers over SSH.
	HTTPURL  string
	Governor *governor.Governor
	Log      *slog.Logger
	// Cluster, on a cluster node, names the repositories it serves LFS
	// for (nil: those on this node's disk).
	Cluster Cluster
}

// Cluster is a cluster node's view of the repositories it serves LFS for:
// every repository of the cluster, whether this node holds a copy of it
// or not, since the objects are in the shared store and the index in the
// shared database (access is decided by the shared access data, as for
// git).
type Cluster interface {
	// Placed tells whether the cluster places the repository name, and
	// its quota in bytes (0: none); repo.ErrNotFound for a repository
	// deleted from the cluster or renamed whose copy here is not moved
	// yet; neither: a repository on this node's disk only.
	Placed(ctx context.Context, name string) (quota int64, placed bool, err error)
	// Restorable tells whether repo restore can still bring back the
	// deletion of name at stamp; once not, Sweep forgets its objects.
	Restorable(ctx context.Context, name, stamp string) (bool, error)
}

// errUnavailable wraps a failure of the store behind a resolution.
var errUnavailable = errors.New("the store did not answer")

// Dir is the LFS directory of a data directory.
func Dir(dataDir string) string { return filepath.Join(dataDir, "lfs") }

// Open opens the disk store and the index under DATA/lfs.
func Open(ctx context.Context, dataDir string) (*Service, error) {
	return OpenStore(ctx, dataDir, "", "")
}

// OpenStore opens the object store storeURL names ("": the disk under
// DATA/lfs; s3://...: a bucket, see OpenS3) and the index: under DATA/lfs,
// or in the PostgreSQL database at databaseURL when it is not "" (a
// cluster's nodes share it, as they share the bucket).
func OpenStore(ctx context.Context, dataDir, storeURL, databaseURL string) (*Service, error) {
	dir := Dir(dataDir)
	var objects Store
	var err error
	if storeURL == "" {
		objects, err = NewDisk(dir)
	} else {
		objects, err = OpenS3(ctx, storeURL)
	}
	if err != nil {
		return nil, fmt.Errorf("lfs: %w", err)
	}
	var index *Index
	if databaseURL != "" {
		index, err = OpenIndexPostgres(ctx, databaseURL)
	} else {
		if err = os.MkdirAll(dir, 0o700); err == nil {
			index, err = OpenIndex(ctx, filepath.Join(dir, IndexFile))
		}
	}
	if err != nil {
		return nil, fmt.Errorf("lfs: %w", err)
	}
	return &Service{Objects: objects, Index: index, Dir: dir}, nil
}

// Close closes the index.
func (s *Service) Close() error { return s.Index.Close() }

func (s *Service) log() *slog.Logger {
	if s.Log == nil {
		return slog.Default()
	}
	return s.Log
}

// need is what an operation requires of the principal.
type need int

const (
	needRead need = iota
	needWrite
	needAdmin
)

// apiError is an answer in LFS's JSON error format.
type apiError struct {
	Status  int
	Message string
}

func (e *apiError) Error() string { return e.Message }

// authorize resolves repoPath and decides whether p may do what n says,
// with the pipeline's rules: no read access looks like no repository (401
// to anonymous HTTP, so that git-lfs asks for credentials).
func (s *Service) authorize(ctx context.Context, p access.Principal, repoPath string, n need, viaHTTP bool) (repo.Repo, *apiError) {
	model, err := s.Access.Load(ctx, p)
	if err != nil {
		return repo.Repo{}, &apiError{http.StatusServiceUnavailable, "temporarily unavailable: the store did not answer, retry shortly"}
	}
	notFound := func(name string) *apiError {
		if viaHTTP && p.IsAnonymous() && (n != needRead || !model.AnonRead(name)) {
			return &apiError{http.StatusUnauthorized, fmt.Sprintf("authentication required for '%s'", name)}
		}
		return &apiError{http.StatusNotFound, fmt.Sprintf("repository '%s' not found", name)}
	}
	r, err := s.resolve(ctx, repoPath)
	if err != nil {
		name, cerr := repo.CleanName(repoPath)
		if cerr != nil {
			name = "?"
		}
		switch {
		case errors.Is(err, repo.ErrNotFound) || errors.Is(err, repo.ErrInvalidName):
			return repo.Repo{}, notFound(name)
		case errors.Is(err, errUnavailable):
			return repo.Repo{}, &apiError{http.StatusServiceUnavailable, "temporarily unavailable: the store did not answer, retry shortly"}
		}
		return repo.Repo{}, &apiError{http.StatusInternalServerError, "internal error resolving repository"}
	}
	op := access.Read
	if n != needRead {
		op = access.Write
	}
	switch err := model.Decide(p, op, r.Name); {
	case err == nil:
	case errors.Is(err, access.ErrNoRead):
		return repo.Repo{}, notFound(r.Name)
	case errors.Is(err, access.ErrAuthRequired):
		return repo.Repo{}, &apiError{http.StatusUnauthorized, fmt.Sprintf("authentication required to write to '%s'", r.Name)}
	default:
		return repo.Repo{}, &apiError{http.StatusForbidden, fmt.Sprintf("permission denied: %s may not write to '%s'", p, r.Name)}
	}
	if n == needAdmin && model.Role(p, r.Name) < access.RoleAdmin {
		return repo.Repo{}, &apiError{http.StatusForbidden, fmt.Sprintf("permission denied: %s is not an admin of '%s'", p, r.Name)}
	}
	return r, nil
}

// resolve finds the repository repoPath names: on a cluster node, any
// the cluster places, with the path of this node's copy if it holds one
// (else Path ""); otherwise, and for a repository on this node's disk
// only, the one on disk.
func (s *Service) resolve(ctx context.Context, repoPath string) (repo.Repo, error) {
	if s.Cluster == nil {
		return s.Repos.Resolve(repoPath)
	}
	name, err := repo.CleanName(repoPath)
	if err != nil {
		return repo.Repo{}, err
	}
	_, placed, err := s.Cluster.Placed(ctx, name)
	if err != nil {
		if errors.Is(err, repo.ErrNotFound) {
			return repo.Repo{}, err
		}
		return repo.Repo{}, fmt.Errorf("%w: %w", errUnavailable, err)
	}
	r, err := s.Repos.Resolve(name)
	if !placed {
		return r, err
	}
	if err != nil || r.Name != name {
		return repo.Repo{Name: name}, nil // no copy here (or not moved here yet)
	}
	return r, nil
}

// quotaRoom is how many more bytes repo may take (LFS objects count with
// git's), or -1 without a quota. On a cluster node without a copy of the
// repository only its LFS objects count: its git objects are not here to
// measure.
func (s *Service) quotaRoom(ctx context.Context, r repo.Repo) (int64, error) {
	var quota, used int64
	var err error
	if r.Path == "" && s.Cluster != nil {
		quota, _, err = s.Cluster.Placed(ctx, r.Name)
	} else {
		quota, err = repo.Quota(r)
	}
	if err != nil || quota <= 0 {
		return -1, err
	}
	if r.Path != "" {
		if used, err = repo.Usage(r); err != nil {
			return 0, err
		}
	}
	_, lfsBytes, err := s.Index.Usage(ctx, r.Name)
	if err != nil {
		return 0, err
	}
	return max(0, quota-used-lfsBytes), nil
}

// record hands one transfer to the governor and logs it.
func (s *Service) record(kind, transport string, r repo.Repo, p access.Principal, remote string, start time.Time, in, out int64, result, errText string) {
	rec := governor.Record{
		ID: governor.NewID(start), Start: start, Transport: transport, Repo: r.Name, User: p.User, Remote: remote,
		Service: "lfs", Kind: kind, BytesIn: in, BytesOut: out, Wall: governor.Duration(time.Since(start)),
		Result: result, Error: errText,
	}
	level := slog.LevelInfo
	if result != governor.ResultOK && result != governor.ResultRefused {
		level = slog.LevelWarn
	}
	s.log().LogAttrs(context.Background(), level, "request", rec.LogAttrs()...)
	if s.Governor != nil {
		s.Governor.Record(rec)
	}
}

// RepoUsage is how many LFS objects repo holds in the data directory and
// their bytes, for the admin commands; a data directory where LFS never
// ran holds none (and is left without an index).
func RepoUsage(ctx context.Context, dataDir, repoName string) (objects, bytes int64, err error) {
	path := filepath.Join(Dir(dataDir), IndexFile)
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return 0, 0, nil
	}
	x, err := OpenIndex(ctx, path)
	if err != nil {
		return 0, 0, err
	}
	defer x.Close()
	return x.Usage(ctx, repoName)
}
