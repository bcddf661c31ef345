package dashboard

import (
	"crypto/rand"
	"encoding/base64"
	"net/http"
	"strings"
	"sync"
	"time"

	"packwire/internal/access"
	"packwire/internal/transport/forwarded"
)

// cookieName holds a random session id; the token never leaves the login form.
const cookieName = "packwire_session"

// maxSessions bounds the table; past it the oldest session is dropped.
const maxSessions = 10_000

// session is one login: who, with which token (so that revoking the token
// ends it), until when.
type session struct {
	user    string
	tokenID string
	expires time.Time
}

// sessions lives in memory only: a restart logs everybody out.
type sessions struct {
	mu sync.Mutex
	m  map[string]session
}

func (s *sessions) create(user, tokenID string, ttl time.Duration) string {
	b := make([]byte, 32)
	rand.Read(b)
	id := base64.RawURLEncoding.EncodeToString(b)
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]session{}
	}
	if len(s.m) >= maxSessions {
		oldest, at := "", now.Add(ttl)
		for k, v := range s.m {
			if v.expires.Before(now) {
				delete(s.m, k)
			} else if v.expires.Before(at) {
				oldest, at = k, v.expires
			}
		}
		if len(s.m) >= maxSessions {
			delete(s.m, oldest)
		}
	}
	s.m[id] = session{user: user, tokenID: tokenID, expires: now.Add(ttl)}
	return id
}

func (s *sessions) get(id string) (session, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[id]
	if ok && time.Now().After(v.expires) {
		delete(s.m, id)
		return session{}, false
	}
	return v, ok
}

func (s *sessions) drop(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, id)
}

// authenticate finds the admin behind a request: a live session whose
// token still stands and whose user is still a server admin, or an admin's
// token over HTTP Basic. Otherwise it answers with the login form (401)
// and returns false: no data is ever rendered for anybody else.
func (h *Handler) authenticate(w http.ResponseWriter, r *http.Request) (string, bool) {
	ctx := r.Context()
	if user, token, ok := r.BasicAuth(); ok {
		p, err := h.Access.PrincipalForToken(ctx, user, token)
		if err == nil && h.Access.IsServerAdmin(ctx, p) {
			return p.User, true
		}
		h.log().Info("dashboard: refused", "remote", r.RemoteAddr, "reason", "Basic credentials are not a server admin's token")
		h.loginPage(w, r, "That token does not belong to a server admin.")
		return "", false
	}
	if c, err := r.Cookie(cookieName); err == nil {
		if s, ok := h.sessions.get(c.Value); ok {
			if h.Access.TokenValid(ctx, s.tokenID, s.user) && h.Access.IsServerAdmin(ctx, access.Principal{User: s.user, Via: "token"}) {
				return s.user, true
			}
			h.sessions.drop(c.Value)
		}
	}
	h.loginPage(w, r, "")
	return "", false
}

func (h *Handler) loginPage(w http.ResponseWriter, r *http.Request, msg string) {
	if strings.HasSuffix(r.URL.Path, ".json") {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		w.Write([]byte(`{"error":"login required"}` + "\n"))
		return
	}
	h.render(w, "login", page{Title: "Log in", Status: http.StatusUnauthorized, Data: msg})
}

// login shows the form (GET) or checks the posted token (POST): a server
// admin's token opens a session; anything else gets the form again.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		h.loginPage(w, r, "")
		return
	case http.MethodPost:
	default:
		w.Header().Set("Allow", "GET, POST")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 4096)
	token := strings.TrimSpace(r.PostFormValue("token"))
	ctx := r.Context()
	p, err := h.Access.PrincipalForToken(ctx, "", token)
	if err != nil || !h.Access.IsServerAdmin(ctx, p) {
		reason := "not a server admin"
		if err != nil {
			reason = err.Error()
		}
		h.log().Info("dashboard: login refused", "remote", r.RemoteAddr, "reason", reason)
		h.loginPage(w, r, "That is not the token of a server admin (admin on '**').")
		return
	}
	id := h.sessions.create(p.User, access.TokenID(token), h.SessionTTL)
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: id, Path: Prefix, HttpOnly: true, Secure: forwarded.Scheme(r) == "https",
		SameSite: http.SameSiteStrictMode, MaxAge: int(h.SessionTTL / time.Second)})
	h.log().Info("dashboard: login", "user", p.User, "remote", r.RemoteAddr)
	http.Redirect(w, r, Prefix+"now", http.StatusSeeOther)
}

func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(cookieName); err == nil {
		h.sessions.drop(c.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: Prefix, HttpOnly: true, Secure: forwarded.Scheme(r) == "https",
		SameSite: http.SameSiteStrictMode, MaxAge: -1})
	http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
}
