package route

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// PingPath is the endpoint on every node's HTTP listener that answers
// "ok" to anyone: each node's heartbeat asks its peers through it
// whether they are reachable over the network pushes replicate on
// (cluster.Node.Reach). It tells nothing else.
const PingPath = "/_packwire/ping"

// PingHandler serves PingPath.
func PingHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "ok\n")
	})
}

// Ping asks the node at nodeURL whether it answers (PingPath), within
// ctx, over the connections replication uses: nil if it did.
func Ping(ctx context.Context, nodeURL string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(nodeURL, "/")+PingPath, nil)
	if err != nil {
		return err
	}
	resp, err := replicateClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s%s: %s", nodeURL, PingPath, resp.Status)
	}
	return nil
}
