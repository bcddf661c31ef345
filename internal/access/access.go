// Package access decides who may do what, for every transport alike. A
// transport only turns its credentials (an SSH key, an HTTP token) into a
// Principal through this package and asks Decide; it never decides itself.
//
// Until per-repository roles land, the policy is the one issue "serve" sets:
// anyone may read, any registered user may push.
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
	"time"

	"golang.org/x/crypto/ssh"

	"packwire/internal/store"
)

// Principal is who a request acts for.
type Principal struct {
	User string // empty for anonymous
	Via  string // "ssh-key", "token" or "anonymous"
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

// Controller answers access questions from the store. The store is read on
// every call so that admin commands take effect at once.
type Controller struct {
	Store *store.Store
}

// Decide returns nil if p may do op on the repository, or the reason not.
func (c *Controller) Decide(ctx context.Context, p Principal, op Op, repoName string) error {
	switch op {
	case Read:
		return nil
	case Write:
		if p.IsAnonymous() {
			return ErrAuthRequired
		}
		// The user may have been removed since the key or token was checked.
		if _, err := c.Store.GetUser(ctx, p.User); err != nil {
			return ErrDenied
		}
		return nil
	}
	return ErrDenied
}

// PrincipalForKey maps an SSH public key to its user. An unknown key is
// anonymous (read-only), not an error: identity is the key, never the
// SSH user name.
func (c *Controller) PrincipalForKey(ctx context.Context, key ssh.PublicKey) (Principal, error) {
	user, err := c.Store.KeyOwner(ctx, ssh.FingerprintSHA256(key))
	if errors.Is(err, store.ErrNotFound) {
		return Anonymous, nil
	}
	if err != nil {
		return Principal{}, err
	}
	return Principal{User: user, Via: "ssh-key"}, nil
}

const tokenPrefix = "pwt_"

// CreateToken makes a new token for user and returns it; only its hash is stored.
func (c *Controller) CreateToken(ctx context.Context, user string, ttl time.Duration) (string, error) {
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
	if err := c.Store.AddToken(ctx, user, id, hashSecret(secretText), expires); err != nil {
		return "", err
	}
	return tokenPrefix + id + "_" + secretText, nil
}

func hashSecret(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

// PrincipalForToken checks an HTTP Basic username and token. The username
// must be the token's owner (or empty, or the literal "token"), so that one
// user's token can never be presented under another user's name.
func (c *Controller) PrincipalForToken(ctx context.Context, username, token string) (Principal, error) {
	rest, ok := strings.CutPrefix(token, tokenPrefix)
	if !ok {
		return Principal{}, ErrBadCredentials
	}
	id, secret, ok := strings.Cut(rest, "_")
	if !ok {
		return Principal{}, ErrBadCredentials
	}
	t, err := c.Store.GetToken(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return Principal{}, ErrBadCredentials
	}
	if err != nil {
		return Principal{}, err
	}
	if subtle.ConstantTimeCompare(t.Hash, hashSecret(secret)) != 1 {
		return Principal{}, ErrBadCredentials
	}
	if !t.Revoked.IsZero() {
		return Principal{}, fmt.Errorf("%w: token revoked", ErrBadCredentials)
	}
	if !t.Expires.IsZero() && time.Now().After(t.Expires) {
		return Principal{}, fmt.Errorf("%w: token expired", ErrBadCredentials)
	}
	if username != "" && username != "token" && username != t.User {
		return Principal{}, fmt.Errorf("%w: token does not belong to %q", ErrBadCredentials, username)
	}
	return Principal{User: t.User, Via: "token"}, nil
}
