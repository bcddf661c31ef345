package ssh

import (
	"errors"
	"strings"

	"packwire/internal/gitexec"
)

// ErrInvalidCommand is returned by ParseCommand for anything that is not one
// git service with one path argument.
var ErrInvalidCommand = errors.New("invalid command")

// maxCommandLen bounds what a client can make the parser look at; git's own
// commands are a service name and a repository path.
const maxCommandLen = 4096

// ParseCommand parses the command of an SSH exec request as the git client
// sends it: "git-upload-pack 'path'" (also git-receive-pack,
// git-upload-archive, and the two-word form "git upload-pack 'path'"). The
// path is either quoted the way git's sq_quote_buf quotes it or a bare word.
// Nothing is ever run through a shell; the strict grammar is there so that
// commands meant for a shell ("git-upload-pack 'x'; id") are refused rather
// than half-understood. The returned path is what the client named and is
// still to be resolved by the pipeline; service is canonical
// ("git-upload-pack").
func ParseCommand(cmd string) (service, path string, err error) {
	if len(cmd) > maxCommandLen {
		return "", "", ErrInvalidCommand
	}
	name, arg, ok := strings.Cut(cmd, " ")
	if !ok {
		return "", "", ErrInvalidCommand
	}
	if name == "git" {
		if name, arg, ok = strings.Cut(arg, " "); !ok {
			return "", "", ErrInvalidCommand
		}
		name = "git-" + name
	}
	svc, ok := gitexec.ParseService(name)
	if !ok || string(svc) != name {
		return "", "", ErrInvalidCommand
	}
	if strings.HasPrefix(arg, "'") {
		path, ok = sqDequote(arg)
	} else {
		path, ok = arg, true
	}
	if !ok || !isSafePath(path) {
		return "", "", ErrInvalidCommand
	}
	return string(svc), path, nil
}

// sqDequote undoes git's sq_quote_buf for exactly one argument, following
// quote.c's sq_dequote_step: the text is single-quoted, and a quote or '!'
// inside it is written as quote, backslash, the byte, quote. Trailing text
// after the closing quote is an error.
func sqDequote(s string) (string, bool) {
	if len(s) < 2 || s[0] != '\'' {
		return "", false
	}
	var b strings.Builder
	for i := 1; ; {
		if i >= len(s) {
			return "", false // unterminated
		}
		if s[i] != '\'' {
			b.WriteByte(s[i])
			i++
			continue
		}
		i++ // stepped out of the quotes
		if i == len(s) {
			return b.String(), true
		}
		if s[i] == '\\' && i+2 < len(s) && (s[i+1] == '\'' || s[i+1] == '!') && s[i+2] == '\'' {
			b.WriteByte(s[i+1])
			i += 3 // the escaped byte and the quote that resumes quoting
			continue
		}
		return "", false
	}
}

// isSafePath accepts only the characters repository paths are made of, so
// that no quote, control byte or shell metacharacter goes any further.
func isSafePath(p string) bool {
	if p == "" {
		return false
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._/~-", c) >= 0
		if !ok {
			return false
		}
	}
	return true
}
