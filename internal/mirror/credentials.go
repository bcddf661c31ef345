package mirror

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"packwire/internal/repo"
)

// credentialsFile holds a repository's mirror credentials (0600), by
// remote name, beside its config: it moves with the repository, while the
// config (which git tools print) and URLs never carry them. git gets them
// from a credential helper reading its environment, so they are in no
// command line (a URL with credentials would be, in git-remote-https's).
const credentialsFile = "packwire-credentials.json"

// Credentials authenticate to a mirror's remote over HTTP(S).
type Credentials struct {
	Username string `json:"username"`
	Password string `json:"password,omitempty"`
}

// Empty reports whether there are none.
func (c Credentials) Empty() bool { return c.Username == "" && c.Password == "" }

// DefaultTokenUser is the user name sent with a --token: GitHub, GitLab
// and packwire accept a token as the password of any user name, and this
// one names what it is.
const DefaultTokenUser = "x-access-token"

// schemeLike matches "transport::address" (remote helpers, ext:: runs
// commands) and "scheme://".
var (
	helperSyntax = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*::`)
	schemeSyntax = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.-]*)://`)
)

// SplitURL checks a mirror URL and takes its credentials out: an
// http(s) URL's user and password (a token alone as the user counts as
// one). Accepted: http, https, ssh, git and file URLs, scp-like
// user@host:path, and local paths; refused: remote helpers
// (transport::address) and other schemes.
func SplitURL(raw string) (clean string, creds Credentials, err error) {
	if raw == "" || strings.ContainsAny(raw, "\n\r\x00") {
		return "", Credentials{}, errors.New("empty or malformed URL")
	}
	if helperSyntax.MatchString(raw) {
		return "", Credentials{}, fmt.Errorf("%s: remote helpers (transport::address) are refused", Redact(raw))
	}
	m := schemeSyntax.FindStringSubmatch(raw)
	if m == nil {
		return raw, Credentials{}, nil // scp-like or a local path
	}
	switch strings.ToLower(m[1]) {
	case "http", "https":
	case "ssh", "git", "file":
		u, err := url.Parse(raw)
		if err != nil {
			return "", Credentials{}, fmt.Errorf("not a URL: %s", Redact(raw))
		}
		if _, hasPassword := u.User.Password(); hasPassword {
			return "", Credentials{}, fmt.Errorf("%s: a password in a %s URL is refused (ssh authenticates with the server user's keys)", Redact(raw), u.Scheme)
		}
		return raw, Credentials{}, nil
	default:
		return "", Credentials{}, fmt.Errorf("%s: scheme %q refused (http, https, ssh, git, file)", Redact(raw), m[1])
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "", Credentials{}, fmt.Errorf("not a URL: %s", Redact(raw))
	}
	if u.User != nil {
		creds.Username = u.User.Username()
		creds.Password, _ = u.User.Password()
		u.User = nil
	}
	return u.String(), creds, nil
}

// Redact is a mirror URL fit to print and log: an http(s) URL without its
// user, password or query; ssh URLs keep their user (git@), which is no
// secret, but never a password.
func Redact(raw string) string {
	m := schemeSyntax.FindStringSubmatch(raw)
	if m == nil {
		if helperSyntax.MatchString(raw) {
			return "(remote helper URL)"
		}
		return raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return m[1] + "://(unparsable)"
	}
	hideUser := false
	if u.User != nil {
		if _, hasPassword := u.User.Password(); hasPassword || u.Scheme == "http" || u.Scheme == "https" {
			hideUser, u.User = true, nil
		}
	}
	if u.RawQuery != "" {
		u.RawQuery = "***"
	}
	u.Fragment = ""
	if hideUser {
		// Written in, not as url.User("***"), which would print %2A%2A%2A.
		return strings.Replace(u.String(), "//", "//***@", 1)
	}
	return u.String()
}

// loadCredentials reads the repository's mirror credentials by remote.
func loadCredentials(dir string) (map[string]Credentials, error) {
	b, err := os.ReadFile(filepath.Join(dir, credentialsFile))
	if errors.Is(err, os.ErrNotExist) {
		return map[string]Credentials{}, nil
	}
	if err != nil {
		return nil, err
	}
	m := map[string]Credentials{}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", credentialsFile, err)
	}
	return m, nil
}

// storeCredentials sets (or with empty creds, removes) a remote's
// credentials: the file is written whole, 0600, and renamed into place.
func storeCredentials(dir, remote string, creds Credentials) error {
	m, err := loadCredentials(dir)
	if err != nil {
		return err
	}
	if creds.Empty() {
		if _, ok := m[remote]; !ok {
			return nil
		}
		delete(m, remote)
	} else {
		m[remote] = creds
	}
	path := filepath.Join(dir, credentialsFile)
	if len(m) == 0 {
		return os.Remove(path)
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	// A name starting with '.': backups leave it out, and it is never served.
	tmp := filepath.Join(dir, "."+credentialsFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o600); err != nil { // WriteFile keeps an old file's mode
		return err
	}
	return os.Rename(tmp, path)
}

// credentialsOf reads one remote's credentials.
func credentialsOf(r repo.Repo, remote string) (Credentials, error) {
	m, err := loadCredentials(r.Path)
	return m[remote], err
}

// credentialHelper answers git's credential requests for one host from
// the environment, and replaces every helper git would ask (so none
// stores these credentials either).
const credentialHelper = `!f() { test "$1" = get || exit 0; h=; while read -r l; do case "$l" in host=*) h="${l#host=}";; esac; done; ` +
	`test "$h" = "$PACKWIRE_MIRROR_HOST" || exit 0; printf 'username=%s\npassword=%s\n' "$PACKWIRE_MIRROR_USERNAME" "$PACKWIRE_MIRROR_PASSWORD"; }; f`

// gitAuth is what git needs to authenticate to rawURL with creds: -c
// arguments (no secret in them) and environment variables (which only
// the same user can read).
func gitAuth(rawURL string, creds Credentials) (args, env []string) {
	if creds.Empty() {
		return nil, nil
	}
	host := ""
	if u, err := url.Parse(rawURL); err == nil {
		host = u.Host
	}
	return []string{"-c", "credential.helper=", "-c", "credential.helper=" + credentialHelper},
		[]string{"PACKWIRE_MIRROR_HOST=" + host, "PACKWIRE_MIRROR_USERNAME=" + creds.Username, "PACKWIRE_MIRROR_PASSWORD=" + creds.Password}
}

// scrub removes credentials from text that git or a remote wrote (git
// never sees them in a URL, but a remote may echo what it was sent).
func scrub(text string, creds Credentials) string {
	for _, secret := range []string{creds.Password, url.QueryEscape(creds.Password), url.PathEscape(creds.Password)} {
		if len(secret) >= 4 {
			text = strings.ReplaceAll(text, secret, "***")
		}
	}
	if creds.Password == "" && len(creds.Username) >= 8 { // a token as the user name
		text = strings.ReplaceAll(text, creds.Username, "***")
	}
	return text
}
