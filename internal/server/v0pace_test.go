package server

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// TestTrickledV0NegotiationCut: a protocol v0 client over git:// or SSH
// that trickles its want section, or a batch of haves, a byte every 100
// ms is refused ("request too slow", in an ERR line) and disconnected
// within --request-timeout (here 1s) and some slack, as a v2 fetch command
// is. On the old server v0 input was not paced: the connection stayed
// open for as long as the client trickled, then for the idle timeout.
func TestTrickledV0NegotiationCut(t *testing.T) {
	const requestTimeout = time.Second
	enableSSH, sshEnvFor := withSSH(t)
	s := startServer(t, func(c *Config) {
		enableSSH(c)
		c.InitTimeout, c.RequestMinRate, c.RequestTimeout = 3*time.Second, 1024, requestTimeout
	})
	sshEnvFor(s) // registers alice's key
	head := s.env.RevParse(s.seed(t, "team/app"), "HEAD")
	wants := pkts("want "+head+" multi_ack_detailed side-band-64k", "")
	haves := pkts("have "+strings.Repeat("2", 40), "have "+strings.Repeat("3", 40), "")
	cases := []struct {
		name       string
		fast, slow []byte
		overSSH    bool
	}{
		{"git/wants", nil, wants, false},
		{"git/haves", wants, haves, false},
		{"ssh/wants", nil, wants, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var in io.Writer
			var out io.Reader
			if tc.overSSH {
				_, stdin, stdout, _, done := s.sshExec(t, "", "git-upload-pack 'team/app'")
				defer done()
				readAdvertisement(t, stdout)
				in, out = stdin, stdout
			} else {
				conn, err := net.Dial("tcp", s.GitAddr.String())
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				conn.Write(request("git-upload-pack", "/team/app", ""))
				readAdvertisement(t, conn)
				in, out = conn, conn
			}
			in.Write(tc.fast)
			start := time.Now()
			stop := make(chan struct{})
			defer close(stop)
			go func() {
				for i := 0; i < len(tc.slow); i++ {
					select {
					case <-stop:
						return
					case <-time.After(100 * time.Millisecond):
					}
					if _, err := in.Write(tc.slow[i : i+1]); err != nil {
						return
					}
				}
			}()
			got := make(chan string, 1)
			go func() { b, _ := io.ReadAll(out); got <- string(b) }()
			select {
			case text := <-got:
				took := time.Since(start)
				t.Logf("cut after %v: %q", took, text)
				if !strings.Contains(text, "ERR request too slow") {
					t.Fatalf("got %q, want an ERR request too slow", text)
				}
				if took > requestTimeout+3*time.Second {
					t.Fatalf("cut after %v, want within --request-timeout %v and some slack", took, requestTimeout)
				}
			case <-time.After(requestTimeout + 8*time.Second):
				t.Fatalf("a client trickling its v0 negotiation still connected %v later", time.Since(start))
			}
		})
	}
}
