package lfs

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"packwire/internal/access"
)

// The file locking API (git-lfs docs/api/locking.md): listing needs read,
// locking, verifying and unlocking one's own lock need write, and removing
// another user's lock (force) needs the repository's admin role.

type lockJSON struct {
	ID       string    `json:"id"`
	Path     string    `json:"path"`
	LockedAt time.Time `json:"locked_at"`
	Owner    struct {
		Name string `json:"name"`
	} `json:"owner"`
}

func toJSON(l Lock) lockJSON {
	j := lockJSON{ID: l.ID, Path: l.Path, LockedAt: l.LockedAt}
	j.Owner.Name = l.Owner
	return j
}

func toJSONs(ls []Lock) []lockJSON {
	out := make([]lockJSON, 0, len(ls))
	for _, l := range ls {
		out = append(out, toJSON(l))
	}
	return out
}

// maxLocksPage bounds one page of a lock listing.
const maxLocksPage = 1000

func (s *Service) locks(w http.ResponseWriter, r *http.Request, p access.Principal, repoPath, rest string) {
	switch {
	case rest == "" && r.Method == http.MethodGet:
		s.listLocks(w, r, p, repoPath)
	case rest == "" && r.Method == http.MethodPost:
		s.createLock(w, r, p, repoPath)
	case rest == "verify" && r.Method == http.MethodPost:
		s.verifyLocks(w, r, p, repoPath)
	case strings.HasSuffix(rest, "/unlock") && r.Method == http.MethodPost:
		s.unlock(w, r, p, repoPath, strings.TrimSuffix(rest, "/unlock"))
	default:
		writeError(w, &apiError{http.StatusNotFound, "not found"})
	}
}

func pageLimit(v string) (int, *apiError) {
	if v == "" {
		return maxLocksPage, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, &apiError{http.StatusUnprocessableEntity, "invalid limit"}
	}
	if n == 0 || n > maxLocksPage {
		n = maxLocksPage
	}
	return n, nil
}

// page cuts one more than limit into a page and the next cursor.
func page(ls []Lock, limit int) ([]Lock, string) {
	if len(ls) > limit {
		return ls[:limit], ls[limit].ID
	}
	return ls, ""
}

func (s *Service) listLocks(w http.ResponseWriter, r *http.Request, p access.Principal, repoPath string) {
	rp, aerr := s.authorize(r.Context(), p, repoPath, needRead, true)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	q := r.URL.Query()
	limit, aerr := pageLimit(q.Get("limit"))
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	ls, err := s.Index.Locks(r.Context(), rp.Name, LockFilter{Path: q.Get("path"), ID: q.Get("id"), Cursor: q.Get("cursor"), Limit: limit + 1})
	if err != nil {
		writeError(w, &apiError{http.StatusServiceUnavailable, "temporarily unavailable: the LFS index did not answer"})
		return
	}
	ls, next := page(ls, limit)
	writeJSON(w, http.StatusOK, struct {
		Locks      []lockJSON `json:"locks"`
		NextCursor string     `json:"next_cursor,omitempty"`
	}{toJSONs(ls), next})
}

func (s *Service) createLock(w http.ResponseWriter, r *http.Request, p access.Principal, repoPath string) {
	var req struct {
		Path string `json:"path"`
	}
	if e := readJSON(r, &req); e != nil {
		writeError(w, e)
		return
	}
	rp, aerr := s.authorize(r.Context(), p, repoPath, needWrite, true)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	if req.Path == "" || len(req.Path) > 4096 {
		writeError(w, &apiError{http.StatusUnprocessableEntity, "a lock needs a path"})
		return
	}
	l, err := s.Index.CreateLock(r.Context(), rp.Name, req.Path, p.User)
	switch {
	case errors.Is(err, ErrLockExists):
		writeJSON(w, http.StatusConflict, struct {
			Lock    lockJSON `json:"lock"`
			Message string   `json:"message"`
		}{toJSON(l), "already created lock"})
	case err != nil:
		writeError(w, &apiError{http.StatusServiceUnavailable, "temporarily unavailable: the LFS index did not answer"})
	default:
		writeJSON(w, http.StatusCreated, struct {
			Lock lockJSON `json:"lock"`
		}{toJSON(l)})
	}
}

func (s *Service) verifyLocks(w http.ResponseWriter, r *http.Request, p access.Principal, repoPath string) {
	var req struct {
		Cursor string `json:"cursor"`
		Limit  int    `json:"limit"`
	}
	if e := readJSON(r, &req); e != nil {
		writeError(w, e)
		return
	}
	rp, aerr := s.authorize(r.Context(), p, repoPath, needWrite, true)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	limit := req.Limit
	if limit <= 0 || limit > maxLocksPage {
		limit = maxLocksPage
	}
	ls, err := s.Index.Locks(r.Context(), rp.Name, LockFilter{Cursor: req.Cursor, Limit: limit + 1})
	if err != nil {
		writeError(w, &apiError{http.StatusServiceUnavailable, "temporarily unavailable: the LFS index did not answer"})
		return
	}
	ls, next := page(ls, limit)
	ours, theirs := []lockJSON{}, []lockJSON{}
	for _, l := range ls {
		if l.Owner == p.User {
			ours = append(ours, toJSON(l))
		} else {
			theirs = append(theirs, toJSON(l))
		}
	}
	writeJSON(w, http.StatusOK, struct {
		Ours       []lockJSON `json:"ours"`
		Theirs     []lockJSON `json:"theirs"`
		NextCursor string     `json:"next_cursor,omitempty"`
	}{ours, theirs, next})
}

func (s *Service) unlock(w http.ResponseWriter, r *http.Request, p access.Principal, repoPath, id string) {
	var req struct {
		Force bool `json:"force"`
	}
	if e := readJSON(r, &req); e != nil {
		writeError(w, e)
		return
	}
	rp, aerr := s.authorize(r.Context(), p, repoPath, needWrite, true)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	ls, err := s.Index.Locks(r.Context(), rp.Name, LockFilter{ID: id})
	if err != nil {
		writeError(w, &apiError{http.StatusServiceUnavailable, "temporarily unavailable: the LFS index did not answer"})
		return
	}
	if len(ls) == 0 {
		writeError(w, &apiError{http.StatusNotFound, "unable to find lock"})
		return
	}
	l := ls[0]
	if l.Owner != p.User {
		if !req.Force {
			writeError(w, &apiError{http.StatusForbidden, fmt.Sprintf("lock is owned by another user (%s): only a repository admin may remove it, with --force", l.Owner)})
			return
		}
		if _, aerr := s.authorize(r.Context(), p, repoPath, needAdmin, true); aerr != nil {
			writeError(w, &apiError{http.StatusForbidden, fmt.Sprintf("lock is owned by another user (%s): removing it needs the admin role on '%s'", l.Owner, rp.Name)})
			return
		}
	}
	if err := s.Index.DeleteLock(r.Context(), rp.Name, l.ID); err != nil {
		writeError(w, &apiError{http.StatusServiceUnavailable, "temporarily unavailable: the LFS index did not answer"})
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Lock lockJSON `json:"lock"`
	}{toJSON(l)})
}
