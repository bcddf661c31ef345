package pipeline

import (
	"bytes"
	"errors"
	"io"
	"sync"

	"packwire/internal/pktline"
)

// admissionGate holds the client's stream of a git:// or SSH upload-pack
// session at its first request for a pack (a v0/v1 "want" line, a v2
// "command=fetch") until the call has a limiter slot. One git serves the
// whole session, so admitting it at connect would make `git ls-remote`
// (an advertisement, or a v2 ls-refs) queue behind clones, which CI
// pollers run every few seconds. Over smart HTTP each request is its own
// call and the advertisement takes no slot already.
type admissionGate struct {
	r      io.Reader
	admit  func() error
	client io.Writer // where a refusal goes, as an ERR pkt-line git shows as "remote error"

	scan     pktScan
	mu       sync.Mutex
	decided  bool
	refusal  error
	refusedC chan struct{} // closed on refusal: git's stderr goes quiet
}

func newAdmissionGate(r io.Reader, admit func() error, client io.Writer) *admissionGate {
	return &admissionGate{r: r, admit: admit, client: client, refusedC: make(chan struct{})}
}

func (g *admissionGate) Read(p []byte) (int, error) {
	n, err := g.r.Read(p)
	if n > 0 && !g.decided && g.scan.feed(p[:n]) {
		g.decided = true
		if aerr := g.admit(); aerr != nil {
			msg := aerr.Error()
			if perr := (*Error)(nil); errors.As(aerr, &perr) {
				msg = perr.Message
			}
			pktline.WriteError(g.client, msg)
			g.mu.Lock()
			g.refusal = aerr
			close(g.refusedC)
			g.mu.Unlock()
			return 0, aerr // git's stdin ends here; it never sees the request
		}
	}
	return n, err
}

// Refusal is the admission error the gate gave the client, if any.
func (g *admissionGate) Refusal() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.refusal
}

// quietAfterRefusal drops git's stderr once the gate refused: git only
// complains that its client hung up, which the client did not.
type quietAfterRefusal struct {
	w       io.Writer
	refused <-chan struct{}
}

func (q quietAfterRefusal) Write(p []byte) (int, error) {
	select {
	case <-q.refused:
		return len(p), nil
	default:
		return q.w.Write(p)
	}
}

// pktScan follows a pkt-line stream across reads and reports the first
// data packet that asks for a pack. A stream that is not pkt-lines
// counts as asking (git will refuse it; the slot is taken meanwhile, as
// before the gate existed).
type pktScan struct {
	hdr  [4]byte
	nhdr int
	left int    // payload bytes of the current packet not seen yet
	head []byte // the current packet's first bytes, up to len(longest prefix)
}

var packRequests = [][]byte{[]byte("want "), []byte("command=fetch")}

const longestPackRequest = len("command=fetch")

func (s *pktScan) feed(b []byte) bool {
	for len(b) > 0 {
		if s.left == 0 {
			k := copy(s.hdr[s.nhdr:], b)
			s.nhdr += k
			b = b[k:]
			if s.nhdr < 4 {
				return false
			}
			s.nhdr = 0
			size, err := pktline.ParseLength(s.hdr[:])
			switch {
			case err != nil || size == 3 || size > pktline.MaxLength:
				return true
			case size < 4: // flush, delim, response-end
				continue
			}
			s.left = size - 4
			s.head = s.head[:0]
			continue
		}
		k := min(s.left, len(b))
		if need := longestPackRequest - len(s.head); need > 0 {
			s.head = append(s.head, b[:min(k, need)]...)
		}
		s.left -= k
		b = b[k:]
		for _, p := range packRequests {
			if len(s.head) >= len(p) && bytes.HasPrefix(s.head, p) {
				return true
			}
		}
	}
	return false
}
