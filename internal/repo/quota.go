package repo

import (
	"bufio"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// QuotaKey is the git config key, in the repository's own config, that
// holds its size quota in bytes: it moves with the repository when it is
// renamed, backed up or restored.
const QuotaKey = "packwire.quota"

// Quota returns the repository's size quota in bytes (0: none), read from
// its config file without spawning git: pushes ask it.
func Quota(r Repo) (int64, error) {
	f, err := os.Open(filepath.Join(r.Path, "config"))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	section := ""
	var quota int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[':
			section = strings.ToLower(strings.Trim(line, "[] \t"))
		case section == "packwire":
			key, value, _ := strings.Cut(line, "=")
			if strings.EqualFold(strings.TrimSpace(key), "quota") {
				v := strings.TrimSpace(value)
				if i := strings.IndexAny(v, "#;"); i >= 0 {
					v = strings.TrimSpace(v[:i])
				}
				if quota, err = strconv.ParseInt(v, 10, 64); err != nil || quota < 0 {
					return 0, errors.New("packwire.quota is not a byte count: " + v)
				}
			}
		}
	}
	return quota, sc.Err()
}

// SetQuota sets the repository's quota in bytes (0 removes it).
func SetQuota(ctx context.Context, r Repo, bytes int64) error {
	if bytes <= 0 {
		_, err := git(ctx, r, "config", "--unset-all", QuotaKey)
		if err != nil && strings.Contains(err.Error(), "exit status 5") {
			return nil // there was none
		}
		return err
	}
	_, err := git(ctx, r, "config", QuotaKey, strconv.FormatInt(bytes, 10))
	return err
}

// Usage is what the repository's objects take on disk, in bytes (packs,
// their indexes, loose objects; a push's quarantine in progress included).
func Usage(r Repo) (int64, error) {
	var total int64
	err := filepath.WalkDir(filepath.Join(r.Path, "objects"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				total += fi.Size()
			}
		}
		return nil
	})
	return total, err
}
