package datadir

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"encoding/pem"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"
)

func fingerprints(signers []ssh.Signer) []string {
	var fps []string
	for _, s := range signers {
		fps = append(fps, s.PublicKey().Type()+" "+ssh.FingerprintSHA256(s.PublicKey()))
	}
	return fps
}

// TestHostKeys: three keys on first use, ed25519 first, in OpenSSH's format
// (ssh-keygen reads them) with mode 0600, the same ones on the next use.
func TestHostKeys(t *testing.T) {
	d := &Data{Dir: t.TempDir()}
	signers, err := d.HostKeys()
	if err != nil {
		t.Fatal(err)
	}
	got := fingerprints(signers)
	wantTypes := []string{ssh.KeyAlgoED25519, ssh.KeyAlgoECDSA256, ssh.KeyAlgoRSA}
	if len(got) != len(wantTypes) {
		t.Fatalf("host keys %v, want types %v", got, wantTypes)
	}
	for i, typ := range wantTypes {
		if !strings.HasPrefix(got[i], typ+" ") {
			t.Fatalf("host key %d is %s, want %s", i, got[i], typ)
		}
	}
	if pub, ok := signers[2].PublicKey().(ssh.CryptoPublicKey).CryptoPublicKey().(*rsa.PublicKey); !ok || pub.N.BitLen() != 3072 {
		t.Fatalf("RSA host key is not 3072 bits")
	}
	for i, name := range []string{"ssh_host_ed25519_key", "ssh_host_ecdsa_key", "ssh_host_rsa_key"} {
		path := filepath.Join(d.Dir, name)
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Fatalf("%s has mode %v, want 0600", name, st.Mode().Perm())
		}
		out, err := exec.Command("ssh-keygen", "-l", "-f", path).CombinedOutput()
		if err != nil {
			t.Fatalf("ssh-keygen -l %s: %v\n%s", name, err, out)
		}
		if fp := strings.Fields(got[i])[1]; !strings.Contains(string(out), fp) {
			t.Fatalf("ssh-keygen sees %s as %s, packwire as %s", name, out, fp)
		}
	}
	again, err := d.HostKeys()
	if err != nil {
		t.Fatal(err)
	}
	if fps := fingerprints(again); strings.Join(fps, ",") != strings.Join(got, ",") {
		t.Fatalf("host keys changed on the second use:\n%v\n%v", got, fps)
	}
	entries, _ := os.ReadDir(d.Dir)
	if len(entries) != 3 {
		t.Fatalf("data directory holds %d files, want the 3 keys and nothing else", len(entries))
	}
}

// TestHostKeysAddedToOldDataDir: a data directory with only the ed25519 key
// (packwire before ECDSA and RSA keys) gains the two others and keeps it.
func TestHostKeysAddedToOldDataDir(t *testing.T) {
	d := &Data{Dir: t.TempDir()}
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	block, err := ssh.MarshalPrivateKey(priv, "packwire host key")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.Dir, "ssh_host_ed25519_key"), pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	old, _ := ssh.NewSignerFromKey(priv)
	signers, err := d.HostKeys()
	if err != nil {
		t.Fatal(err)
	}
	if len(signers) != 3 || ssh.FingerprintSHA256(signers[0].PublicKey()) != ssh.FingerprintSHA256(old.PublicKey()) {
		t.Fatalf("host keys %v: the ed25519 key changed or keys are missing", fingerprints(signers))
	}
}

// TestHostKeysRacingStarts: servers starting at once on a new data directory
// end up with the same keys, and none reads a half-written one.
func TestHostKeysRacingStarts(t *testing.T) {
	dir := t.TempDir()
	const starts = 4
	var wg sync.WaitGroup
	results := make([][]string, starts)
	errs := make([]error, starts)
	for i := range starts {
		wg.Go(func() {
			signers, err := (&Data{Dir: dir}).HostKeys()
			results[i], errs[i] = fingerprints(signers), err
		})
	}
	wg.Wait()
	for i := range starts {
		if errs[i] != nil {
			t.Fatalf("start %d: %v", i, errs[i])
		}
		if strings.Join(results[i], ",") != strings.Join(results[0], ",") {
			t.Fatalf("starts disagree on the host keys:\n%v\n%v", results[0], results[i])
		}
	}
}

// TestWriteExclusive: what a file system without hard links falls back to
// creates the key 0600 and never replaces an existing one.
func TestWriteExclusive(t *testing.T) {
	path := filepath.Join(t.TempDir(), "key")
	if err := writeExclusive(path, []byte("first")); err != nil {
		t.Fatal(err)
	}
	if err := writeExclusive(path, []byte("second")); !errors.Is(err, os.ErrExist) {
		t.Fatalf("second create: %v, want ErrExist", err)
	}
	got, _ := os.ReadFile(path)
	st, _ := os.Stat(path)
	if string(got) != "first" || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file %q mode %v, want \"first\" 0600", got, st.Mode().Perm())
	}
}

// TestOpenNeverCreates: Open on a missing directory, or on one without a
// store, is a NoDataError and leaves the file system as it was; Create
// makes the store, which Open then opens.
func TestOpenNeverCreates(t *testing.T) {
	ctx := context.Background()
	parent := t.TempDir()
	missing := filepath.Join(parent, "typo", "data")
	empty := filepath.Join(parent, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{missing, empty} {
		_, err := Open(ctx, dir)
		var nd *NoDataError
		if !errors.As(err, &nd) || nd.Dir != dir {
			t.Fatalf("Open(%s): %v, want a NoDataError naming it", dir, err)
		}
	}
	if _, err := os.Stat(filepath.Join(parent, "typo")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Open created the missing directory: %v", err)
	}
	if entries, _ := os.ReadDir(empty); len(entries) != 0 {
		t.Fatalf("Open wrote into a directory without a store: %v", entries)
	}
	d, err := Create(ctx, missing)
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	d, err = Open(ctx, missing)
	if err != nil {
		t.Fatalf("Open after Create: %v", err)
	}
	d.Close()
}

// TestDirFromEnvironment: $PACKWIRE_DATA replaces the default directory.
func TestDirFromEnvironment(t *testing.T) {
	t.Setenv(EnvDir, "")
	if Dir() != DefaultDir {
		t.Fatalf("Dir() = %q without %s", Dir(), EnvDir)
	}
	t.Setenv(EnvDir, "/srv/packwire")
	if Dir() != "/srv/packwire" {
		t.Fatalf("Dir() = %q with %s=/srv/packwire", Dir(), EnvDir)
	}
}
