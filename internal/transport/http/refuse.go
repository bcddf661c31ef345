package http

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// connectionRetryAfter is the Retry-After of a connection refused for the
// cap: git does not act on it, but other clients and proxies may.
const connectionRetryAfter = 5

// RefuseConnection answers a connection over one of the server's
// connection bounds with a minimal "503 Service Unavailable" and msg as a
// one-line text body, which git prints as "remote: server busy: ...". It speaks HTTP itself, so the
// connection never reaches net/http. With tlsConfig it completes the TLS
// handshake first, offering HTTP/1.1 only (ALPN would otherwise pick h2,
// which this answer is not). It is bounded to a few seconds.
func RefuseConnection(conn net.Conn, tlsConfig *tls.Config, msg string) {
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	if tlsConfig != nil {
		cfg := tlsConfig.Clone()
		cfg.NextProtos = []string{"http/1.1"}
		tc := tls.Server(conn, cfg)
		if tc.Handshake() != nil {
			return
		}
		conn = tc
	}
	// Read the request head first: closing while the client still writes
	// it would reset the connection before the answer is read.
	http.ReadRequest(bufio.NewReaderSize(conn, 4096))
	msg += "\n"
	fmt.Fprintf(conn, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"+
		"Retry-After: %d\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", connectionRetryAfter, len(msg), msg)
	// Half-close, then take what is left of a request body until the client
	// closes, for the same reason.
	if cw, ok := conn.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	conn.SetDeadline(time.Now().Add(time.Second))
	io.Copy(io.Discard, io.LimitReader(conn, 1<<20))
}
