package lfs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3 keeps objects in a bucket of an S3-compatible store, under
// PREFIX/lfs/OID. Uploads still pass through packwire, which verifies them
// as they stream to the bucket; downloads are pre-signed GET URLs the
// client fetches from the store itself.
type S3 struct {
	client *minio.Client
	bucket string
	prefix string // "" or "some/path/", before "lfs/"
	// opTimeout bounds a metadata call (stat, remove, presign).
	opTimeout time.Duration
}

// OpenS3 opens the bucket a store URL names:
//
//	s3://BUCKET[/PREFIX]?endpoint=http://HOST:PORT&region=R&credentials=FILE&profile=P&lookup=path|dns
//
// endpoint defaults to AWS (https://s3.amazonaws.com); it must be one the
// LFS clients can reach too, the pre-signed URLs name it. Credentials come
// from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN),
// or from an AWS credentials file (credentials=FILE, profile=P: default
// "default"); never from the URL itself, which shows in ps and logs. The
// bucket must exist.
func OpenS3(ctx context.Context, raw string) (*S3, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("--lfs-store: %w", err)
	}
	if u.Scheme != "s3" || u.Host == "" {
		return nil, fmt.Errorf("--lfs-store %q: s3://BUCKET?endpoint=... expected", raw)
	}
	if u.User != nil {
		return nil, fmt.Errorf("--lfs-store: credentials do not go in the URL: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or credentials=FILE")
	}
	q := u.Query()
	endpoint := q.Get("endpoint")
	if endpoint == "" {
		endpoint = "https://s3.amazonaws.com"
	}
	e, err := url.Parse(endpoint)
	if err != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" {
		return nil, fmt.Errorf("--lfs-store: endpoint %q: http(s)://HOST[:PORT] expected", endpoint)
	}
	var creds *credentials.Credentials
	if file := q.Get("credentials"); file != "" {
		profile := q.Get("profile")
		if profile == "" {
			profile = "default"
		}
		creds = credentials.NewFileAWSCredentials(file, profile)
	} else {
		creds = credentials.NewEnvAWS()
	}
	if v, err := creds.GetWithContext(nil); err != nil || v.AccessKeyID == "" || v.SecretAccessKey == "" {
		return nil, fmt.Errorf("--lfs-store: no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or add credentials=FILE (an AWS credentials file)")
	}
	lookup := minio.BucketLookupAuto
	switch q.Get("lookup") {
	case "path":
		lookup = minio.BucketLookupPath
	case "dns":
		lookup = minio.BucketLookupDNS
	case "":
		if q.Get("endpoint") != "" { // S3-compatible servers: path style
			lookup = minio.BucketLookupPath
		}
	default:
		return nil, fmt.Errorf("--lfs-store: lookup=%q: path or dns", q.Get("lookup"))
	}
	region := q.Get("region")
	if region == "" {
		region = "us-east-1" // presigning without a region would ask the store first
	}
	client, err := minio.New(e.Host, &minio.Options{
		Creds: creds, Secure: e.Scheme == "https", Region: region, BucketLookup: lookup,
	})
	if err != nil {
		return nil, fmt.Errorf("--lfs-store: %w", err)
	}
	s := &S3{client: client, bucket: u.Host, opTimeout: time.Minute}
	if p := strings.Trim(u.Path, "/"); p != "" {
		s.prefix = p + "/"
	}
	cctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	ok, err := client.BucketExists(cctx, s.bucket)
	if err != nil {
		return nil, fmt.Errorf("--lfs-store: bucket %s at %s: %w", s.bucket, endpoint, err)
	}
	if !ok {
		return nil, fmt.Errorf("--lfs-store: bucket %s does not exist at %s: create it first", s.bucket, endpoint)
	}
	return s, nil
}

// String names the store for logs.
func (s *S3) String() string {
	return "s3://" + s.bucket + "/" + s.prefix + " at " + s.client.EndpointURL().String()
}

func (s *S3) key(oid string) string { return s.prefix + "lfs/" + oid }

// Stat returns the stored size of oid; an unreachable store reads as
// "not stored" (the client is asked to upload, or told it is missing).
func (s *S3) Stat(oid string) (int64, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), s.opTimeout)
	defer cancel()
	info, err := s.client.StatObject(ctx, s.bucket, s.key(oid), minio.StatObjectOptions{})
	if err != nil {
		return 0, false
	}
	return info.Size, true
}

// Open opens oid's content (the SSH transfer, and the HTTP object URL of a
// client that asks packwire itself).
func (s *S3) Open(oid string) (io.ReadSeekCloser, fs.FileInfo, error) {
	obj, err := s.client.GetObject(context.Background(), s.bucket, s.key(oid), minio.GetObjectOptions{})
	if err != nil {
		return nil, nil, err
	}
	info, err := obj.Stat()
	if err != nil {
		obj.Close()
		return nil, nil, err
	}
	return obj, objectInfo{name: oid, size: info.Size, mod: info.LastModified}, nil
}

// Put streams exactly size bytes of r to the bucket under oid's key,
// hashing them on the way: the store receives the last bytes only once
// they complete the right SHA-256 and r has nothing more, so a wrong
// upload's PUT (or its multipart upload's last part) is cut short and the
// store commits nothing. One PUT commits whole or not at all, and a
// multipart upload is visible only once completed (minio-go aborts it on
// an error), so no temporary key nor copy is needed. Multipart parts are
// buffered: up to 16 MiB of memory per upload over that size.
func (s *S3) Put(oid string, size int64, r io.Reader) (written int64, err error) {
	v := &verifier{r: io.LimitReader(r, size+1), oid: oid, size: size, h: sha256.New()}
	_, err = s.client.PutObject(context.Background(), s.bucket, s.key(oid), v, size,
		minio.PutObjectOptions{ContentType: "application/octet-stream"})
	if v.err != nil {
		return v.n, v.err
	}
	if err != nil {
		return v.n, fmt.Errorf("storing in the S3 bucket: %w", err)
	}
	return v.n, nil
}

// verifier passes r on, withholding the bytes that complete size until
// they hash to oid and r ends.
type verifier struct {
	r    io.Reader
	oid  string
	size int64
	n    int64
	h    hash.Hash
	err  error
	done bool
}

func (v *verifier) Read(p []byte) (int, error) {
	if v.err != nil {
		return 0, v.err
	}
	if v.done {
		return 0, io.EOF
	}
	if v.n == v.size { // size 0: nothing to pass on
		if v.err = v.check(); v.err != nil {
			return 0, v.err
		}
		v.done = true
		return 0, io.EOF
	}
	if rem := v.size - v.n; int64(len(p)) > rem {
		p = p[:rem]
	}
	k, err := v.r.Read(p)
	v.h.Write(p[:k])
	v.n += int64(k)
	if v.n == v.size {
		if v.err = v.check(); v.err != nil {
			return 0, v.err // the last bytes never reach the store
		}
		v.done = true
		return k, nil
	}
	if errors.Is(err, io.EOF) {
		v.err = fmt.Errorf("%w: received %d bytes, expected %d", ErrSizeMismatch, v.n, v.size)
		return 0, v.err
	}
	if err != nil {
		v.err = err
		return 0, err
	}
	return k, nil
}

// check, once size bytes were read: nothing more, and the right hash.
func (v *verifier) check() error {
	var one [1]byte
	if k, _ := io.ReadFull(v.r, one[:]); k > 0 {
		return fmt.Errorf("%w: received more than %d bytes", ErrSizeMismatch, v.size)
	}
	if got := hex.EncodeToString(v.h.Sum(nil)); got != v.oid {
		return fmt.Errorf("%w: content hashes to %s", ErrHashMismatch, got)
	}
	return nil
}

// Remove deletes oid's content.
func (s *S3) Remove(oid string) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.opTimeout)
	defer cancel()
	return s.client.RemoveObject(ctx, s.bucket, s.key(oid), minio.RemoveObjectOptions{})
}

// Walk lists the bucket's objects under PREFIX/lfs/.
func (s *S3) Walk(ctx context.Context, fn func(oid string, size int64, stored time.Time) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the listing if fn fails
	for info := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix + "lfs/", Recursive: true}) {
		if info.Err != nil {
			return info.Err
		}
		if oid := path.Base(info.Key); ValidOID(oid) {
			if err := fn(oid, info.Size, info.LastModified); err != nil {
				return err
			}
		}
	}
	return nil
}

// DownloadURL pre-signs a GET of oid's key, good for ttl.
func (s *S3) DownloadURL(ctx context.Context, oid string, ttl time.Duration) (string, error) {
	u, err := s.client.PresignedGetObject(ctx, s.bucket, s.key(oid), ttl, nil)
	if err != nil {
		return "", err
	}
	return u.String(), nil
}

// objectInfo is an S3 object's fs.FileInfo, for http.ServeContent.
type objectInfo struct {
	name string
	size int64
	mod  time.Time
}

func (o objectInfo) Name() string       { return o.name }
func (o objectInfo) Size() int64        { return o.size }
func (o objectInfo) Mode() fs.FileMode  { return 0o400 }
func (o objectInfo) ModTime() time.Time { return o.mod }
func (o objectInfo) IsDir() bool        { return false }
func (o objectInfo) Sys() any           { return nil }
