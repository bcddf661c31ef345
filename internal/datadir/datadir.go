// Package datadir owns the layout of packwire's data directory, created by
// Create (packwire serve, packwire init) and only opened by Open (every
// admin command), so that a mistyped --data never makes a new, empty one:
//
//	DIR/repos/                  bare repositories (team/app -> repos/team/app.git)
//	DIR/packwire.db             the embedded SQLite store (unless --database
//	                            names PostgreSQL: a cluster's shared store)
//	DIR/ssh_host_ed25519_key    the SSH host keys (OpenSSH format, 0600)
//	DIR/ssh_host_ecdsa_key      (P-256)
//	DIR/ssh_host_rsa_key        (3072 bits)
package datadir

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
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
	// Database is the store's postgres:// URL ("": the SQLite file), where
	// the governor's records are kept too (governor.OpenIn).
	Database string
}

// EnvDir names the environment variable that, when set, replaces DefaultDir
// as every command's default data directory.
const EnvDir = "PACKWIRE_DATA"

// StoreFile is the store's file name: a directory holding it is packwire data.
const StoreFile = "packwire.db"

// Dir is the data directory to use when none is given: $PACKWIRE_DATA, else
// DefaultDir.
func Dir() string {
	if d := os.Getenv(EnvDir); d != "" {
		return d
	}
	return DefaultDir
}

// NoDataError is Open's answer for a directory that holds no packwire data
// (missing, or without a store): nothing was created.
type NoDataError struct {
	Dir string // absolute
}

func (e *NoDataError) Error() string {
	return fmt.Sprintf("no packwire data in %s", e.Dir)
}

// EnvDatabase names the environment variable that, when set, is every
// command's default --database.
const EnvDatabase = "PACKWIRE_DATABASE"

// Database is the database to use when none is given: $PACKWIRE_DATABASE,
// else "" (the SQLite store in the data directory).
func Database() string { return os.Getenv(EnvDatabase) }

// Create opens the data directory, creating it and its store if needed.
func Create(ctx context.Context, dir string) (*Data, error) {
	return CreateWith(ctx, dir, "")
}

// Open opens an existing data directory; one without a store is a
// *NoDataError, and nothing is created.
func Open(ctx context.Context, dir string) (*Data, error) {
	return OpenWith(ctx, dir, "")
}

// CreateWith is Create with the store in database: "" for the SQLite
// file in the directory, or a postgres:// URL (the store's tables are
// created there if missing).
func CreateWith(ctx context.Context, dir, database string) (*Data, error) {
	return open(ctx, dir, database, true)
}

// OpenWith is Open with the store in database. With PostgreSQL the data
// directory need not exist (an admin command changing the access model
// from any machine that reaches the database); it is never created, and
// repositories are looked for in it.
func OpenWith(ctx context.Context, dir, database string) (*Data, error) {
	return open(ctx, dir, database, false)
}

// Exists reports whether dir holds packwire data (its store).
func Exists(dir string) (bool, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false, err
	}
	st, err := os.Stat(filepath.Join(abs, StoreFile))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return st.Mode().IsRegular(), nil
}

func open(ctx context.Context, dir, database string, create bool) (*Data, error) {
	if dir == "" {
		dir = Dir()
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	postgres := store.IsPostgresURL(database)
	if database != "" && !postgres {
		return nil, fmt.Errorf("--database %s: not a postgres:// URL (leave it out for the SQLite store in the data directory)", store.RedactDatabaseURL(database))
	}
	switch {
	case create:
		// 0700: it holds the store (webhook secrets, token hashes) and the
		// host keys. An existing directory keeps its mode (an operator's).
		if err := os.MkdirAll(abs, 0o700); err != nil {
			return nil, fmt.Errorf("data directory: %w", err)
		}
		if err := os.MkdirAll(filepath.Join(abs, "repos"), 0o755); err != nil {
			return nil, fmt.Errorf("data directory: %w", err)
		}
	case postgres: // the store is elsewhere: nothing to check here
	default:
		if ok, err := Exists(abs); err != nil {
			return nil, fmt.Errorf("data directory: %w", err)
		} else if !ok {
			return nil, &NoDataError{Dir: abs}
		}
	}
	var st *store.Store
	if postgres {
		st, err = store.OpenPostgres(ctx, database)
	} else {
		st, err = store.Open(ctx, filepath.Join(abs, StoreFile))
	}
	if err != nil {
		return nil, err
	}
	// Read once: a change applies to the repositories created after the
	// next start (the server creates none itself; the CLI reads it fresh).
	defaultBranch, err := st.Setting(ctx, repo.SettingDefaultBranch, repo.DefaultBranch)
	if err != nil {
		st.Close()
		return nil, err
	}
	return &Data{
		Dir:      abs,
		Repos:    repo.Root{Dir: filepath.Join(abs, "repos"), DefaultBranch: defaultBranch},
		Store:    st,
		Access:   &access.Controller{Store: st},
		Database: database, // "" or postgres://, checked above
	}, nil
}

// Close closes the store.
func (d *Data) Close() error { return d.Store.Close() }

// HostKeys loads the SSH host keys, ed25519 first, generating and saving
// each one missing so that the fingerprints clients pin stay the same. A data
// directory from before ECDSA and RSA keys gains them and keeps its ed25519
// key. ECDSA and RSA are there for clients without ed25519 (jsch and older
// JGit fail with "Algorithm negotiation fail" otherwise).
func (d *Data) HostKeys() ([]ssh.Signer, error) {
	var signers []ssh.Signer
	for _, k := range hostKeyFiles {
		signer, err := loadOrCreateHostKey(filepath.Join(d.Dir, k.name), k.generate)
		if err != nil {
			return nil, err
		}
		signers = append(signers, signer)
	}
	return signers, nil
}

// hostKeyFiles are the host keys in the order the server offers them.
var hostKeyFiles = []struct {
	name     string
	generate func() (crypto.Signer, error)
}{
	{"ssh_host_ed25519_key", func() (crypto.Signer, error) {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		return priv, err
	}},
	{"ssh_host_ecdsa_key", func() (crypto.Signer, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }},
	{"ssh_host_rsa_key", func() (crypto.Signer, error) { return rsa.GenerateKey(rand.Reader, 3072) }},
}

// loadOrCreateHostKey reads the key at path, or generates one and creates
// path with it. The key is written to a temporary file and linked into place:
// like O_EXCL, the link fails if path exists, so processes racing on first
// start agree on one key, and none can read a half-written file.
func loadOrCreateHostKey(path string, generate func() (crypto.Signer, error)) (ssh.Signer, error) {
	pemBytes, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		if pemBytes, err = createHostKey(path, generate); errors.Is(err, os.ErrExist) {
			pemBytes, err = os.ReadFile(path)
		}
	}
	if err != nil {
		return nil, err
	}
	signer, err := ssh.ParsePrivateKey(pemBytes)
	if err != nil {
		return nil, fmt.Errorf("host key %s: %w", path, err)
	}
	return signer, nil
}

func createHostKey(path string, generate func() (crypto.Signer, error)) ([]byte, error) {
	priv, err := generate()
	if err != nil {
		return nil, err
	}
	block, err := ssh.MarshalPrivateKey(priv, "packwire host key")
	if err != nil {
		return nil, err
	}
	pemBytes := pem.EncodeToMemory(block)
	tmp := filepath.Join(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-"+rand.Text())
	if err := writeExclusive(tmp, pemBytes); err != nil {
		return nil, err
	}
	defer os.Remove(tmp)
	if err = os.Link(tmp, path); err != nil && !errors.Is(err, os.ErrExist) {
		// No hard links on this file system (git falls back from them too):
		// an exclusive create alone still makes racing starts agree.
		err = writeExclusive(path, pemBytes)
	}
	return pemBytes, err
}

// writeExclusive creates path (0600), failing if it exists, with data synced
// to disk: a crash must not leave an empty key behind the name.
func writeExclusive(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}
