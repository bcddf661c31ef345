// Package accept is the accept loop the connection transports (git://,
// SSH) share: back off on temporary errors, and tell a listener closed on
// purpose from one that failed.
package accept

import (
	"errors"
	"net"
	"time"
)

// Loop accepts connections on l and passes each to start, which must not
// block (it starts the connection's goroutine). It returns nil once closed
// reports that l was closed on purpose, or the error that stopped it.
func Loop(l net.Listener, closed func() bool, start func(net.Conn)) error {
	for {
		conn, err := l.Accept()
		if err != nil {
			if closed() {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			return err
		}
		start(conn)
	}
}
