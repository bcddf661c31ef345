package lfs

import (
	"fmt"
	"net/http"
)

// A cluster's nodes serve every repository, so every node must serve
// every LFS object: the objects live in a store they share (S3) and the
// index in their PostgreSQL database (Service.Database), so that an
// object is acknowledged to a client only once the store has it and the
// shared index says so.

// ClusterNeedsStore is why LFS is off on a cluster node without a
// shared store.
func ClusterNeedsStore(node string) string {
	return fmt.Sprintf("Git LFS is off on cluster node %s: a cluster's nodes must share the LFS store; start every node with --lfs-store s3://BUCKET?endpoint=... (or --lfs=false)", node)
}

// Refuse answers every LFS request with why LFS is off (501, in LFS's
// error format), rather than a bare 404 that git-lfs would report as a
// missing repository.
func Refuse(why string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{http.StatusNotImplemented, why})
	})
}
