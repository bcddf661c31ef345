package mirror

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"packwire/internal/repo"
)

// Spec is a repository's whole mirroring with its credentials: what a
// cluster keeps in its store for every copy (each node applies it to its
// copy's config and credentials file), where one server keeps it in the
// repository only.
type Spec struct {
	Pull   *PullSpec  `json:"pull,omitempty"`
	Pushes []PushSpec `json:"pushes,omitempty"`
	// Source is the credentials of a one-off import's source (no pull
	// mirror): a cluster's primary imports with them, then drops them.
	// Never applied to a copy.
	Source *Credentials `json:"source,omitempty"`
}

// PullSpec is the upstream of a read-only pull mirror.
type PullSpec struct {
	URL         string      `json:"url"` // no credentials
	Interval    string      `json:"interval"`
	Credentials Credentials `json:"credentials,omitzero"`
}

// PushSpec is one push mirror.
type PushSpec struct {
	ID          int         `json:"id"`
	URL         string      `json:"url"` // no credentials
	Credentials Credentials `json:"credentials,omitzero"`
}

// NewPullSpec checks an upstream as Import does and takes its credentials
// (from the URL, or the token) out of it. It returns the URL fit to print.
func NewPullSpec(source, token string, interval time.Duration) (PullSpec, string, error) {
	clean, creds, err := SplitURL(source)
	if err != nil {
		return PullSpec{}, "", err
	}
	if interval <= 0 {
		interval = DefaultInterval
	}
	return PullSpec{URL: clean, Interval: interval.String(), Credentials: withToken(creds, token)}, Redact(clean), nil
}

// ParseSpec reads a Spec as Encode wrote it ("": no mirroring).
func ParseSpec(text string) (Spec, error) {
	var s Spec
	if text == "" {
		return s, nil
	}
	if err := json.Unmarshal([]byte(text), &s); err != nil {
		return s, fmt.Errorf("mirror settings: %w", err)
	}
	return s, nil
}

// Encode writes the Spec for the store.
func (s Spec) Encode() string {
	b, _ := json.Marshal(s)
	return string(b)
}

// Config is the Spec as ReadConfig reads it back from a copy.
func (s Spec) Config() Config {
	c := Config{Interval: DefaultInterval}
	if s.Pull != nil {
		c.PullRemote, c.PullURL = PullRemote, s.Pull.URL
		if d, err := time.ParseDuration(s.Pull.Interval); err == nil && d > 0 {
			c.Interval = d
		}
	}
	for _, p := range s.Pushes {
		c.Pushes = append(c.Pushes, PushMirror{ID: p.ID, Remote: PushRemotePrefix + strconv.Itoa(p.ID), URL: p.URL})
	}
	return c
}

// WithPush adds a push mirror (the next id) as AddPush does on one copy.
func (s Spec) WithPush(rawURL, token string) (Spec, PushMirror, error) {
	clean, creds, err := SplitURL(rawURL)
	if err != nil {
		return s, PushMirror{}, err
	}
	id := 1
	for _, p := range s.Pushes {
		id = max(id, p.ID+1)
	}
	out := s
	out.Pushes = append(append([]PushSpec{}, s.Pushes...), PushSpec{ID: id, URL: clean, Credentials: withToken(creds, token)})
	return out, PushMirror{ID: id, Remote: PushRemotePrefix + strconv.Itoa(id), URL: clean}, nil
}

// WithoutPush removes push mirror id.
func (s Spec) WithoutPush(repoName string, id int) (Spec, PushMirror, error) {
	out := s
	out.Pushes = nil
	var gone *PushSpec
	for _, p := range s.Pushes {
		if p.ID == id {
			gone = &p
			continue
		}
		out.Pushes = append(out.Pushes, p)
	}
	if gone == nil {
		return s, PushMirror{}, fmt.Errorf("%s has no push mirror %d", repoName, id)
	}
	return out, PushMirror{ID: id, Remote: PushRemotePrefix + strconv.Itoa(id), URL: gone.URL}, nil
}

// SpecOf reads a copy's mirroring and credentials.
func SpecOf(r repo.Repo) (Spec, error) {
	cfg, err := ReadConfig(r)
	if err != nil {
		return Spec{}, err
	}
	creds, err := loadCredentials(r.Path)
	if err != nil {
		return Spec{}, err
	}
	var s Spec
	if cfg.IsPullMirror() {
		s.Pull = &PullSpec{URL: cfg.PullURL, Interval: cfg.Interval.String(), Credentials: creds[cfg.PullRemote]}
	}
	for _, p := range cfg.Pushes {
		s.Pushes = append(s.Pushes, PushSpec{ID: p.ID, URL: p.URL, Credentials: creds[p.Remote]})
	}
	return s, nil
}

// ApplySpec makes a copy's mirroring and credentials the Spec's: the pull
// remote as git clone --mirror configures it, push mirrors' remotes added
// and removed. A copy already as the Spec says is not written.
func ApplySpec(ctx context.Context, r repo.Repo, s Spec) error {
	have, err := SpecOf(r)
	if err != nil {
		return err
	}
	s.Source = nil
	if have.Encode() == s.Encode() {
		return nil
	}
	cfg := filepath.Join(r.Path, "config")
	unset := func(key string) {
		git(ctx, "", nil, "config", "--file", cfg, "--unset-all", key) // absent: nothing to unset
	}
	if s.Pull != nil {
		if err := storeCredentials(r.Path, PullRemote, s.Pull.Credentials); err != nil {
			return err
		}
		unset("remote." + PullRemote + ".fetch")
		if err := setConfig(ctx, r.Path, "remote."+PullRemote+".url", s.Pull.URL, "remote."+PullRemote+".fetch", "+refs/*:refs/*",
			"remote."+PullRemote+".mirror", "true", KeyPullMirror, PullRemote, KeyInterval, s.Pull.Interval); err != nil {
			return err
		}
	} else if have.Pull != nil {
		unset(KeyPullMirror)
		unset(KeyInterval)
		if err := storeCredentials(r.Path, PullRemote, Credentials{}); err != nil {
			return err
		}
	}
	want := map[int]bool{}
	for _, p := range s.Pushes {
		want[p.ID] = true
		remote := PushRemotePrefix + strconv.Itoa(p.ID)
		if err := storeCredentials(r.Path, remote, p.Credentials); err != nil {
			return err
		}
		if err := setConfig(ctx, r.Path, "remote."+remote+".url", p.URL, "remote."+remote+".mirror", "true"); err != nil {
			return err
		}
	}
	for _, p := range have.Pushes {
		if want[p.ID] {
			continue
		}
		remote := PushRemotePrefix + strconv.Itoa(p.ID)
		if _, err := git(ctx, "", nil, "config", "--file", cfg, "--remove-section", "remote."+remote); err != nil {
			return err
		}
		if err := storeCredentials(r.Path, remote, Credentials{}); err != nil {
			return err
		}
	}
	return nil
}
