// Package access decides who may do what, for every transport alike. A
// transport only turns its credentials (an SSH key, an HTTP token) into a
// Principal through this package and asks Decide; it never decides itself.
//
// The model: users with SSH keys and HTTP tokens, per-repository roles
// granted by pattern (roles.go), anonymous read on or off per pattern, and
// per-ref push rules that the push pipeline enforces on what the client
// sends (first matching rule decides).
package access

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"packwire/internal/store"
)

// Principal is who a request acts for.
type Principal struct {
	User string // empty for anonymous
	Via  string // "ssh-key", "token" or "anonymous"
	// checked is the store version a token was checked at, for the
	// request's first Load instead of reading it again (a round trip to
	// PostgreSQL); taken once, so that a Principal kept for later
	// requests reads the version again.
	checked *checkedVersion
}

// checkedVersion is a store version read once and used once.
type checkedVersion struct {
	mu   sync.Mutex
	v    int64
	ok   bool // read, kept-able, and not yet taken
	read bool // read and kept-able
}

// CheckedVersion is the store version p's token was checked at, for
// another node of a cluster that serves the same request (a relay): ok
// is false for a principal without one.
func (p Principal) CheckedVersion() (v int64, ok bool) {
	if p.checked == nil {
		return 0, false
	}
	p.checked.mu.Lock()
	defer p.checked.mu.Unlock()
	return p.checked.v, p.checked.read
}

// WithCheckedVersion is p for a request whose credentials another node
// of the cluster checked at store version v (CheckedVersion, which the
// relay carries): the request's first Load uses v, as that node's did.
func WithCheckedVersion(p Principal, v int64) Principal {
	p.checked = &checkedVersion{v: v, ok: true, read: true}
	return p
}

func (c *checkedVersion) take() (int64, bool) {
	if c == nil {
		return 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.v, c.ok
	c.ok = false
	return v, ok
}

// Anonymous is the principal of requests without credentials.
var Anonymous = Principal{Via: "anonymous"}

// IsAnonymous reports whether no user is known.
func (p Principal) IsAnonymous() bool { return p.User == "" }

func (p Principal) String() string {
	if p.IsAnonymous() {
		return "anonymous"
	}
	return p.User
}

// Op is what a request wants to do to a repository.
type Op int

const (
	Read  Op = iota // clone, fetch, ls-remote, archive
	Write           // push
)

func (o Op) String() string {
	if o == Write {
		return "write"
	}
	return "read"
}

var (
	// ErrAuthRequired: the request needs a user, and none was given.
	ErrAuthRequired = errors.New("authentication required")
	// ErrDenied: the user is known and may not do this.
	ErrDenied = errors.New("permission denied")
	// ErrBadCredentials: a token was presented and is not valid.
	ErrBadCredentials = errors.New("invalid credentials")
)

// Controller answers access questions from the store. What it loads is
// current for every call: either read from the store, or kept from an
// earlier call while the store's Version says nothing was written since
// (any write, by any process: a revocation applies to the very next
// request).
type Controller struct {
	Store *store.Store
	// ClusterSecret, when set (a cluster node), is the password of
	// ClusterUser: another node replicating a push or catching up a copy.
	ClusterSecret string

	kept keptModels
}

// ClusterUser is the HTTP user name nodes of a cluster use with each
// other; it is not a user of the store and cannot be created as one.
const ClusterUser = "packwire-cluster"

// ViaCluster marks the principal of a request from another node: it may
// read and write every repository, and ref rules were already applied on
// the node the client pushed to.
const ViaCluster = "cluster"

// IsCluster reports whether p is another node of the cluster.
func (p Principal) IsCluster() bool { return p.Via == ViaCluster }

// ErrNoRead: the principal may not read the repository. Transports show it
// exactly like a missing repository, so that access never leaks existence.
var ErrNoRead = errors.New("no read access")

// Model is a snapshot of the access model for one request: read once,
// decided in memory (a 5,000-ref push asks thousands of questions).
type Model struct {
	AnonReadDefault bool
	AnonReads       []store.AnonRead
	Grants          []store.Grant // of the request's user only
	Rules           []store.Rule
}

// Load returns what decisions for p need. The model is shared between
// requests: callers only read it. The store is asked within
// store.RequestTimeout: an error means it could not answer in time.
func (c *Controller) Load(ctx context.Context, p Principal) (*Model, error) {
	ctx, cancel := store.RequestContext(ctx)
	defer cancel()
	// The version the request's token was checked at, moments ago: the
	// request is decided as of then.
	version, ok := p.checked.take()
	if !ok {
		var err error
		if version, ok, err = c.Store.Version(ctx); err != nil {
			return nil, err
		}
	}
	if ok {
		if m := c.kept.model(version, p.User); m != nil {
			return m, nil
		}
	}
	// Read after the version: a write that lands meanwhile moves the
	// version, so the next call reads again.
	m, err := c.load(ctx, p)
	if err == nil && ok {
		c.kept.keepModel(version, p.User, m)
	}
	return m, err
}

func (c *Controller) load(ctx context.Context, p Principal) (*Model, error) {
	m := &Model{}
	def, err := c.Store.Setting(ctx, SettingAnonRead, "on")
	if err != nil {
		return nil, err
	}
	m.AnonReadDefault = def == "on"
	if m.AnonReads, err = c.Store.AnonReads(ctx); err != nil {
		return nil, err
	}
	if !p.IsAnonymous() {
		// A removed user has no grants: the query joins on users.
		if m.Grants, err = c.Store.Grants(ctx, p.User); err != nil {
			return nil, err
		}
	}
	if m.Rules, err = c.Store.Rules(ctx); err != nil {
		return nil, err
	}
	return m, nil
}

// SettingAnonRead is the settings key of the server-wide anonymous read switch.
const SettingAnonRead = "anonymous-read"

// Decide returns nil if p may do op on the repository, or the reason not:
// ErrNoRead (hide the repository), ErrAuthRequired (anonymous push) or
// ErrDenied (a known user who may read but not write).
func (m *Model) Decide(p Principal, op Op, repoName string) error {
	// The wrapped text says what decided, for the refusal's log line.
	role := m.Role(p, repoName)
	canRead := role >= RoleRead || m.AnonRead(repoName)
	if !canRead {
		return fmt.Errorf("%w: role %s on %s, anonymous read off", ErrNoRead, role, repoName)
	}
	if op == Read {
		return nil
	}
	if p.IsAnonymous() {
		return ErrAuthRequired
	}
	if role < RoleWrite {
		return fmt.Errorf("%w: role %s on %s (write needs a write or admin grant)", ErrDenied, role, repoName)
	}
	return nil
}

// AnonRead reports whether anyone may read repoName: the most specific
// matching per-pattern override decides (a tie: off wins), else the
// server-wide switch.
func (m *Model) AnonRead(repoName string) bool {
	best, bestSpec := m.AnonReadDefault, -1
	for _, a := range m.AnonReads {
		if !Match(a.RepoPattern, repoName) {
			continue
		}
		sp := specificity(a.RepoPattern)
		if sp > bestSpec || sp == bestSpec && !a.Enabled {
			best, bestSpec = a.Enabled, sp
		}
	}
	return best
}

// Role is p's role on repoName: the highest of its matching grants.
func (m *Model) Role(p Principal, repoName string) Role {
	if p.IsAnonymous() {
		return RoleNone
	}
	if p.IsCluster() {
		return RoleAdmin
	}
	r := RoleNone
	for _, g := range m.Grants {
		if g.User == p.User && Match(g.RepoPattern, repoName) {
			r = max(r, ParseRoleOrNone(g.Role))
		}
	}
	return r
}

// IsServerAdmin reports whether p has the admin role on "**" (every repository).
func (c *Controller) IsServerAdmin(ctx context.Context, p Principal) bool {
	if p.IsAnonymous() {
		return false
	}
	gs, err := c.Store.Grants(ctx, p.User)
	if err != nil {
		return false
	}
	for _, g := range gs {
		if g.RepoPattern == "**" && g.Role == RoleAdmin.String() {
			return true
		}
	}
	return false
}

// PrincipalForKey maps an SSH public key to its user. An unknown key is
// anonymous (read-only), not an error: identity is the key, never the
// SSH user name. An error is the store's (none within store.RequestTimeout).
func (c *Controller) PrincipalForKey(ctx context.Context, key ssh.PublicKey) (Principal, error) {
	return c.PrincipalForFingerprint(ctx, ssh.FingerprintSHA256(key))
}

// PrincipalForFingerprint is PrincipalForKey by the key's SHA256
// fingerprint: an open SSH connection asks again before each command, as
// its key may have been removed since it authenticated. An error is the
// store's (none within store.RequestTimeout).
func (c *Controller) PrincipalForFingerprint(ctx context.Context, fingerprint string) (Principal, error) {
	ctx, cancel := store.RequestContext(ctx)
	defer cancel()
	version, ok, err := c.Store.Version(ctx)
	if err != nil {
		return Principal{}, err
	}
	user, kept := "", false
	if ok {
		user, kept = c.kept.keyOwner(version, fingerprint)
	}
	if !kept {
		user, err = c.Store.KeyOwner(ctx, fingerprint)
		if errors.Is(err, store.ErrNotFound) {
			user, err = "", nil
		}
		if err == nil && ok {
			c.kept.keepKeyOwner(version, fingerprint, user)
		}
	}
	if err != nil {
		return Principal{}, err
	}
	if user == "" {
		return Anonymous, nil
	}
	return Principal{User: user, Via: "ssh-key"}, nil
}

const tokenPrefix = "pwt_"

// CreateToken makes a new token for user and returns it; only its hash is stored.
func (c *Controller) CreateToken(ctx context.Context, user string, ttl time.Duration) (string, error) {
	return c.CreateScopedToken(ctx, user, ttl, "")
}

// CreateScopedToken makes a token limited to scope ("" is none:
// store.ScopeMetrics is good for /metrics and nothing else).
func (c *Controller) CreateScopedToken(ctx context.Context, user string, ttl time.Duration, scope string) (string, error) {
	if scope != "" && scope != store.ScopeMetrics {
		return "", fmt.Errorf("unknown token scope %q (metrics, or none)", scope)
	}
	idBytes := make([]byte, 8)
	secret := make([]byte, 32)
	rand.Read(idBytes)
	rand.Read(secret)
	id := hex.EncodeToString(idBytes)
	secretText := base64.RawURLEncoding.EncodeToString(secret)
	var expires time.Time
	if ttl > 0 {
		expires = time.Now().Add(ttl)
	}
	if err := c.Store.AddToken(ctx, user, id, hashSecret(secretText), expires, scope); err != nil {
		return "", err
	}
	return tokenPrefix + id + "_" + secretText, nil
}

// splitToken splits "pwt_<id>_<secret>"; the secret may contain '_'.
func splitToken(token string) (id, secret string, ok bool) {
	rest, ok := strings.CutPrefix(token, tokenPrefix)
	if !ok {
		return "", "", false
	}
	return strings.Cut(rest, "_")
}

// TokenID is the public id of a token (what "token list" shows and
// "token revoke" takes), or "" if it is not shaped like one.
func TokenID(token string) string {
	id, _, _ := splitToken(token)
	return id
}

// TokenValid reports whether the token with this id still belongs to user
// and is neither revoked nor expired: for sessions that were opened with
// it, so that revoking the token ends them.
func (c *Controller) TokenValid(ctx context.Context, id, user string) bool {
	t, err := c.Store.GetToken(ctx, id)
	return err == nil && t.User == user && t.Revoked.IsZero() && (t.Expires.IsZero() || time.Now().Before(t.Expires))
}

func hashSecret(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

// ownerAgnosticNames are Basic-auth user names that name no user: the token
// alone says whose it is. "x-access-token" (GitHub) and "oauth2" (GitLab) are
// what CI systems and credential helpers send with a token.
var ownerAgnosticNames = map[string]bool{"": true, "token": true, "x-access-token": true, "oauth2": true}

// PrincipalForToken checks an HTTP Basic username and token for git. The
// username must be the token's owner or one of ownerAgnosticNames, so that
// one user's token can never be presented under another user's name. A
// token scoped to /metrics is not one for git. An error other than
// ErrBadCredentials is the store's (none within store.RequestTimeout).
func (c *Controller) PrincipalForToken(ctx context.Context, username, token string) (Principal, error) {
	if username == ClusterUser {
		if c.ClusterSecret == "" || subtle.ConstantTimeCompare([]byte(token), []byte(c.ClusterSecret)) != 1 {
			return Principal{}, ErrBadCredentials
		}
		return Principal{User: ClusterUser, Via: ViaCluster}, nil
	}
	ctx, cancel := store.RequestContext(ctx)
	defer cancel()
	t, version, err := c.checkTokenAt(ctx, username, token)
	if err != nil {
		return Principal{}, err
	}
	if t.Scope != "" {
		return Principal{}, fmt.Errorf("%w: a %s token is not for git", ErrBadCredentials, t.Scope)
	}
	return Principal{User: t.User, Via: "token", checked: version}, nil
}

// MayReadMetrics tells whether a token (HTTP Basic, any owner-agnostic user
// name, or a Bearer token: username "") may read /metrics: one scoped to
// metrics, or any token of a server admin.
func (c *Controller) MayReadMetrics(ctx context.Context, username, token string) (bool, error) {
	t, err := c.checkToken(ctx, username, token)
	if err != nil {
		return false, err
	}
	return t.Scope == store.ScopeMetrics || t.Scope == "" && c.IsServerAdmin(ctx, Principal{User: t.User, Via: "token"}), nil
}

// token is the stored token with this id, kept while the store's Version
// stays (a revocation moves it). Unknown ids are not kept: anyone may
// offer them.
func (c *Controller) token(ctx context.Context, id string) (store.Token, *checkedVersion, error) {
	version, ok, err := c.Store.Version(ctx)
	if err != nil {
		return store.Token{}, nil, err
	}
	checked := &checkedVersion{v: version, ok: ok, read: ok}
	if ok {
		if t, kept := c.kept.token(version, id); kept {
			return t, checked, nil
		}
	}
	t, err := c.Store.GetToken(ctx, id)
	if err == nil && ok {
		c.kept.keepToken(version, t)
	}
	return t, checked, err
}

// checkToken returns the stored token if token is valid for username.
func (c *Controller) checkToken(ctx context.Context, username, token string) (store.Token, error) {
	t, _, err := c.checkTokenAt(ctx, username, token)
	return t, err
}

// checkTokenAt is checkToken, with the store version it checked at.
func (c *Controller) checkTokenAt(ctx context.Context, username, token string) (store.Token, *checkedVersion, error) {
	id, secret, ok := splitToken(token)
	if !ok {
		return store.Token{}, nil, ErrBadCredentials
	}
	t, checked, err := c.token(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.Token{}, nil, ErrBadCredentials
	}
	if err != nil {
		return store.Token{}, nil, err
	}
	if subtle.ConstantTimeCompare(t.Hash, hashSecret(secret)) != 1 {
		return store.Token{}, nil, ErrBadCredentials
	}
	if !t.Revoked.IsZero() {
		return store.Token{}, nil, fmt.Errorf("%w: token revoked", ErrBadCredentials)
	}
	if !t.Expires.IsZero() && time.Now().After(t.Expires) {
		return store.Token{}, nil, fmt.Errorf("%w: token expired", ErrBadCredentials)
	}
	if !ownerAgnosticNames[username] && username != t.User {
		return store.Token{}, nil, fmt.Errorf("%w: token does not belong to %q", ErrBadCredentials, username)
	}
	return t, checked, nil
}
