// Package datadir owns the layout of packwire's data directory, created on
// first use:
//
//	DIR/repos/                  bare repositories (team/app -> repos/team/app.git)
//	DIR/packwire.db             the embedded SQLite store
//	DIR/ssh_host_ed25519_key    the SSH host key (OpenSSH format, 0600)
package datadir

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/crypto/ssh"

	"packwire/internal/access"
	"packwire/internal/repo"
	"packwire/internal/store"
)

// DefaultDir is where packwire keeps its data unless --data says otherwise.
const DefaultDir = "./packwire-data"

// Data is an open data directory.
type Data struct {
	Dir    string
	Repos  repo.Root
	Store  *store.Store
	Access *access.Controller
}

// Open creates the data directory if needed and opens its store.
func Open(ctx context.Context, dir string) (*Data, error) {
	if dir == "" {
		dir = DefaultDir
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(abs, "repos"), 0o755); err != nil {
		return nil, fmt.Errorf("data directory: %w", err)
	}
	st, err := store.Open(ctx, filepath.Join(abs, "packwire.db"))
	if err != nil {
		return nil, err
	}
	return &Data{
		Dir:    abs,
		Repos:  repo.Root{Dir: filepath.Join(abs, "repos")},
		Store:  st,
		Access: &access.Controller{Store: st},
	}, nil
}

// Close closes the store.
func (d *Data) Close() error { return d.Store.Close() }

// HostKey loads the SSH host key, generating and saving an ed25519 key on
// first use so that the fingerprint clients pin stays the same.
func (d *Data) HostKey() (ssh.Signer, error) {
	path := filepath.Join(d.Dir, "ssh_host_ed25519_key")
	pemBytes, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, err
		}
		block, err := ssh.MarshalPrivateKey(priv, "packwire host key")
		if err != nil {
			return nil, err
		}
		pemBytes = pem.EncodeToMemory(block)
		// O_EXCL: if two processes race on first start, one key wins and both use it.
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err == nil {
			_, err = f.Write(pemBytes)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				os.Remove(path)
				return nil, err
			}
		} else if errors.Is(err, os.ErrExist) {
			if pemBytes, err = os.ReadFile(path); err != nil {
				return nil, err
			}
		} else {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	signer, err := ssh.ParsePrivateKey(pemBytes)
	if err != nil {
		return nil, fmt.Errorf("host key %s: %w", path, err)
	}
	return signer, nil
}
