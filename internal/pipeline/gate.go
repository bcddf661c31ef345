package pipeline

import (
	"errors"
	"io"
	"sync"

	"packwire/internal/pktline"
	"packwire/internal/protocol"
)

// admissionGate holds the client's stream of a git:// or SSH upload-pack
// session at its first request for a pack (a v0/v1 "want" line, a v2
// "command=fetch") until the call has a limiter slot. One git serves the
// whole session, so admitting it at connect would make `git ls-remote`
// (an advertisement, or a v2 ls-refs) queue behind clones, which CI
// pollers run every few seconds. Over smart HTTP each request is its own
// call and the advertisement takes no slot already. It tells a pack
// request by the request's classifier, which it feeds (through watch, the
// governor's tap when there is one) before git sees the bytes.
type admissionGate struct {
	r          io.Reader
	watch      io.Writer // feeds classifier
	classifier *protocol.Classifier
	admit      func() error
	client     io.Writer // where a refusal goes, as an ERR pkt-line git shows as "remote error"

	mu       sync.Mutex
	decided  bool
	refusal  error
	refusedC chan struct{} // closed on refusal: git's stderr goes quiet
}

func newAdmissionGate(r io.Reader, watch io.Writer, classifier *protocol.Classifier, admit func() error, client io.Writer) *admissionGate {
	return &admissionGate{r: r, watch: watch, classifier: classifier, admit: admit, client: client, refusedC: make(chan struct{})}
}

func (g *admissionGate) Read(p []byte) (int, error) {
	n, err := g.r.Read(p)
	if n > 0 {
		g.watch.Write(p[:n])
	}
	if n > 0 && !g.decided && g.classifier.PackRequested() {
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
