package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"golang.org/x/crypto/ssh"

	"packwire/bench/internal/benchkit"
	"packwire/internal/lab/compare"
)

// idleWorkload holds n idle connections to each server on each transport
// and reads the server's memory: git:// connected without a request line,
// HTTP after one ref advertisement on a keep-alive connection, SSH after
// the handshake and authentication, with no channel open.
func (s *setup) idleWorkload(r *report, n int) {
	log.Printf("%d idle connections per transport ...", n)
	keyBytes, err := os.ReadFile(s.key)
	if err != nil {
		benchkit.Fatalf("%v", err)
	}
	signer, err := ssh.ParsePrivateKey(keyBytes)
	if err != nil {
		benchkit.Fatalf("%v", err)
	}
	r.section(fmt.Sprintf("%d idle connections", n),
		"Connections opened one after another and held: git:// without sending the request line, HTTP/1.1 keep-alive after one ref advertisement, SSH after key exchange and authentication with no channel. "+
			"RSS is the anonymous memory (total_rss) of the server's cgroup with all of them held, minus before; 'held' counts connections still open after 3 s.")
	r.table("| transport | server | held | RSS before | RSS with all held | per connection | note |", "|---|---|---:|---:|---:|---:|---|")
	for _, tr := range s.transports() {
		for _, pw := range []bool{true, false} {
			name, srv, port, user := tr.peerName, tr.peerSrv, tr.peerSrv.Port, benchkit.SSHDUser
			if pw {
				name, srv, user = "packwire", tr.pwServer, "bench"
				port = map[string]string{"git://": s.pwGit, "HTTP": s.pwHTTP, "SSH": s.pwSSH}[tr.name]
			}
			// dial opens one idle connection and returns how to close it
			// and how to tell whether the server still holds it.
			dial := func() (io.Closer, func() bool, error) {
				c, err := net.DialTimeout("tcp", "127.0.0.1:"+port, 10*time.Second)
				if err != nil {
					return nil, nil, err
				}
				switch tr.name {
				case "HTTP":
					url := "/" + s.repo + ".git/info/refs?service=git-upload-pack"
					fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nGit-Protocol: version=2\r\n\r\n", url)
					resp, err := http.ReadResponse(bufio.NewReader(c), nil)
					if err != nil {
						c.Close()
						return nil, nil, err
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				case "SSH":
					sc, chans, reqs, err := ssh.NewClientConn(c, "127.0.0.1:"+port, &ssh.ClientConfig{
						User: user, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
						HostKeyCallback: ssh.InsecureIgnoreHostKey(), Timeout: 10 * time.Second,
					})
					if err != nil {
						c.Close()
						return nil, nil, err
					}
					client := ssh.NewClient(sc, chans, reqs)
					return client, func() bool {
						_, _, err := client.SendRequest("keepalive@openssh.com", true, nil)
						return err == nil
					}, nil
				}
				return c, func() bool { return isOpen(c) }, nil
			}
			before := srv.Group.RSS()
			var held []io.Closer
			var alives []func() bool
			var firstErr error
			failed := 0
			for i := 0; i < n; i++ {
				closer, aliveFn, err := dial()
				if err != nil {
					failed++
					if firstErr == nil {
						firstErr = err
					}
					continue
				}
				held = append(held, closer)
				alives = append(alives, aliveFn)
			}
			time.Sleep(3 * time.Second)
			with := srv.Group.RSS()
			alive := 0
			for _, isAlive := range alives {
				if isAlive() {
					alive++
				}
			}
			for _, c := range held {
				c.Close()
			}
			note := ""
			if failed > 0 {
				note = fmt.Sprintf("%d failed to open: %v", failed, firstErr)
			}
			per := "-"
			if alive > 0 {
				per = fmt.Sprintf("%.1f KiB", float64(with-before)/float64(alive)/1024)
			}
			r.row(tr.name, name, strconv.Itoa(alive), mib(before), mib(with), per, note)
			if pw {
				r.target(fmt.Sprintf("%d idle %s connections: packwire RSS < 200 MB", n, tr.name), float64(with)/1e6, 200, compare.Result{})
				if alive < n {
					r.note(fmt.Sprintf("packwire held only %d of %d idle %s connections", alive, n, tr.name))
				}
			}
			time.Sleep(2 * time.Second) // let the server notice the hang-ups
		}
	}
}

// isOpen tells whether the server still holds a connection: a read that
// times out means nothing arrived and nothing closed it.
func isOpen(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	var b [1]byte
	_, err := c.Read(b[:])
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
