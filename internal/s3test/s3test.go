// Package s3test starts a real S3-compatible server for tests: SeaweedFS's
// "weed mini" (master, volume, filer and S3 gateway in one process) in a
// temporary directory on loopback, with a fixed access key, one per test
// binary (Shared; the package's TestMain stops it with Main). weed is not
// in Debian: scripts/install-deps builds it from the Go module proxy into
// its cache directory, where Bin finds it (or on PATH, or $PACKWIRE_WEED).
package s3test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"packwire/internal/procgroup"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// The server's only identity (an admin: it may create buckets).
const (
	AccessKey = "packwire-test"
	SecretKey = "packwire-test-secret"
)

// Bin finds weed: $PACKWIRE_WEED, install-deps's cache directory
// ($PACKWIRE_TOOLS, else ~/.cache/packwire/tools), then PATH; "" if none.
func Bin() string {
	if p := os.Getenv("PACKWIRE_WEED"); p != "" {
		return p
	}
	tools := os.Getenv("PACKWIRE_TOOLS")
	if tools == "" {
		if home, err := os.UserHomeDir(); err == nil {
			tools = filepath.Join(home, ".cache", "packwire", "tools")
		}
	}
	if tools != "" {
		if fi, err := os.Stat(filepath.Join(tools, "weed")); err == nil && fi.Mode()&0o111 != 0 {
			return filepath.Join(tools, "weed")
		}
	}
	if p, err := exec.LookPath("weed"); err == nil {
		return p
	}
	return ""
}

// Server is a running weed with its S3 gateway.
type Server struct {
	// Endpoint is the S3 gateway's URL, http://127.0.0.1:PORT.
	Endpoint string
	dir      string
	cmd      *exec.Cmd
	done     chan struct{}
	client   *minio.Client
}

var shared struct {
	once sync.Once
	s    *Server
	err  error
}

// Shared returns the test binary's weed, starting it on first use; without
// weed the test is skipped, saying how to build it.
func Shared(t testing.TB) *Server {
	t.Helper()
	if e := os.Getenv(EnvEndpoint); e != "" {
		shared.once.Do(func() { shared.s, shared.err = external(e) })
		if shared.err != nil {
			t.Fatalf("%s=%s: %v", EnvEndpoint, e, shared.err)
		}
		return shared.s
	}
	bin := Bin()
	if bin == "" {
		// weed takes tens of minutes to build on two cores, so it is opt-in
		// (PACKWIRE_WEED_BUILD=1 scripts/install-deps): without it the S3
		// tests skip, loudly, whatever PACKWIRE_TEST_ALLOW_SKIP says.
		t.Skip("SKIP: the S3-store tests need SeaweedFS's weed: PACKWIRE_WEED_BUILD=1 scripts/install-deps builds it into ~/.cache/packwire/tools (tens of minutes), or set " + EnvEndpoint)
	}
	shared.once.Do(func() { shared.s, shared.err = Launch(bin) })
	if shared.err != nil {
		t.Fatalf("starting weed: %v", shared.err)
	}
	return shared.s
}

// Main runs the tests, then stops the server Shared started, if any.
func Main(m *testing.M) int {
	code := m.Run()
	StopShared()
	return code
}

// StopShared stops the server Shared started, if any (for a TestMain that
// runs the tests through another Main).
func StopShared() {
	if shared.s != nil {
		shared.s.Stop()
	}
}

// EnvEndpoint names an S3-compatible server already running (http://HOST:PORT)
// that accepts AccessKey and SecretKey, to run the tests against instead
// of starting weed.
const EnvEndpoint = "PACKWIRE_TEST_S3_ENDPOINT"

// external is the server EnvEndpoint names (never stopped here).
func external(endpoint string) (*Server, error) {
	u, err := neturl.Parse(endpoint)
	if err != nil {
		return nil, err
	}
	s := &Server{Endpoint: strings.TrimSuffix(endpoint, "/")}
	s.client, err = minio.New(u.Host, &minio.Options{
		Creds: credentials.NewStaticV4(AccessKey, SecretKey, ""), Region: "us-east-1", BucketLookup: minio.BucketLookupPath,
	})
	return s, err
}

// freePort is a loopback port nothing listens on now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// freePorts is n distinct loopback ports nothing listens on now.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close() // held until all are chosen: n distinct ports
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// weedPortFlags are weed mini's listeners besides the S3 gateway's. Each
// gets a port chosen here: left to their defaults, two test binaries'
// weeds started at once (scripts/test runs packages in parallel) met on
// the same master and filer, and one's gateway died under the other's
// tests ("connection refused" mid-test).
var weedPortFlags = []string{"-master.port", "-master.port.grpc", "-volume.port", "-volume.port.grpc",
	"-filer.port", "-filer.port.grpc", "-s3.port.grpc", "-admin.port", "-admin.port.grpc"}

// Launch starts weed mini with only what S3 needs, every listener on a
// port chosen here, and waits until its gateway answers.
func Launch(bin string) (*Server, error) {
	dir, err := os.MkdirTemp("", "packwire-weed-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ { // a port taken between freePort and weed's bind
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s := &Server{Endpoint: "http://127.0.0.1:" + strconv.Itoa(port), dir: dir, done: make(chan struct{})}
		if lastErr = s.start(bin, port); lastErr == nil {
			return s, nil
		}
		s.stopProcess()
	}
	os.RemoveAll(dir)
	return nil, lastErr
}

func (s *Server) start(bin string, port int) error {
	data := filepath.Join(s.dir, "data")
	os.RemoveAll(data)
	if err := os.MkdirAll(data, 0o700); err != nil {
		return err
	}
	log, err := os.Create(filepath.Join(s.dir, "weed.log"))
	if err != nil {
		return err
	}
	defer log.Close()
	args := []string{"mini", "-dir=" + data, "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
		"-s3.port=" + strconv.Itoa(port), "-s3.port.iceberg=0", "-s3.port.lance=0",
		"-webdav=false", "-admin.ui=false", "-admin.port.legacy=0", "-master.telemetry=false"}
	ports, err := freePorts(len(weedPortFlags))
	if err != nil {
		return err
	}
	for i, flag := range weedPortFlags {
		args = append(args, flag+"="+strconv.Itoa(ports[i]))
	}
	s.cmd = exec.Command(bin, args...)
	s.cmd.Dir = s.dir
	s.cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID="+AccessKey, "AWS_SECRET_ACCESS_KEY="+SecretKey)
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if err := procgroup.Start(s.cmd); err != nil {
		return err
	}
	go func() { s.cmd.Wait(); close(s.done) }()
	s.client, err = minio.New("127.0.0.1:"+strconv.Itoa(port), &minio.Options{
		Creds: credentials.NewStaticV4(AccessKey, SecretKey, ""), Region: "us-east-1", BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		return err
	}
	// A loaded machine starts weed's four services slowly: a generous
	// bound, a safety net only (readiness is the gateway answering).
	deadline := time.Now().Add(3 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := s.client.ListBuckets(ctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-s.done:
			out, _ := os.ReadFile(filepath.Join(s.dir, "weed.log"))
			return fmt.Errorf("weed exited: %s", tail(out, 2000))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(filepath.Join(s.dir, "weed.log"))
			return fmt.Errorf("weed's S3 gateway did not answer within 3 minutes: %v\n%s", err, tail(out, 2000))
		}
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// stopProcess ends weed's process group and waits for it.
func (s *Server) stopProcess() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	procgroup.Terminate(s.cmd)
	select {
	case <-s.done:
	case <-time.After(20 * time.Second):
		procgroup.Kill(s.cmd)
		<-s.done
	}
}

// Stop stops weed and removes its files.
func (s *Server) Stop() {
	if s.dir == "" {
		return // external
	}
	s.stopProcess()
	os.RemoveAll(s.dir)
}

// Client is an S3 client of the server, with the admin identity.
func (s *Server) Client() *minio.Client { return s.client }

// Env is the environment that gives packwire the server's credentials.
func (s *Server) Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + AccessKey, "AWS_SECRET_ACCESS_KEY=" + SecretKey}
}

// NewBucket creates an empty bucket of a fresh name for t and returns the
// name; the test's objects stay apart from other tests'.
func (s *Server) NewBucket(t testing.TB) string {
	t.Helper()
	b := make([]byte, 6)
	rand.Read(b)
	name := "t-" + hex.EncodeToString(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.client.MakeBucket(ctx, name, minio.MakeBucketOptions{}); err != nil {
		t.Fatalf("creating bucket %s: %v", name, err)
	}
	return name
}

// StoreURL is packwire's --lfs-store for bucket, its credentials in an
// AWS credentials file of t's (not the process's environment).
func (s *Server) StoreURL(t testing.TB, bucket string) string {
	t.Helper()
	creds := filepath.Join(t.TempDir(), "credentials")
	text := "[default]\naws_access_key_id = " + AccessKey + "\naws_secret_access_key = " + SecretKey + "\n"
	if err := os.WriteFile(creds, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return "s3://" + bucket + "?endpoint=" + s.Endpoint + "&credentials=" + creds
}

// Keys lists bucket's object keys and its incomplete multipart uploads
// (an upload refused half way must leave neither).
func (s *Server) Keys(t testing.TB, bucket string) (objects, uploads []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for o := range s.client.ListObjects(ctx, bucket, minio.ListObjectsOptions{Recursive: true}) {
		if o.Err != nil {
			t.Fatalf("listing %s: %v", bucket, o.Err)
		}
		objects = append(objects, o.Key)
	}
	for u := range s.client.ListIncompleteUploads(ctx, bucket, "", true) {
		if u.Err != nil {
			t.Fatalf("listing uploads of %s: %v", bucket, u.Err)
		}
		uploads = append(uploads, u.Key)
	}
	return objects, uploads
}
