package route

import (
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"packwire/internal/gitexec"
	"packwire/internal/pipeline"
	"packwire/internal/repo"
	"packwire/internal/server/cluster"
	"packwire/internal/store"
)

// echoNode is a serving node's relay endpoint that answers each relay
// with its stream, as git's output, and hands over its headers.
func echoNode(t *testing.T) (url string, headers chan http.Header) {
	headers = make(chan http.Header, 16)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case headers <- r.Header.Clone():
		default:
		}
		echo(w, r)
	}))
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL, headers
}

// echo answers as Handler does (its headers at once: the relaying node
// feeds the stream only then), with the stream read whole.
func echo(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	rc.EnableFullDuplex()
	w.Header().Set("Trailer", trlExit)
	w.WriteHeader(http.StatusOK)
	rc.Flush()
	b, _ := io.ReadAll(r.Body)
	w.Write(b)
	w.Header().Set(trlExit, "0")
}

// TestRelayCarriesThePlacement: the placement the relaying node routed by
// goes with the relay, and the serving node routes by it without reading
// it again (its store is not asked: here it cannot answer).
func TestRelayCarriesThePlacement(t *testing.T) {
	url, headers := echoNode(t)
	rt := &Router{Secret: "s"}
	pl := cluster.Placement{Repo: "app", Primary: "a", Generation: 7, Epoch: 2, Replicas: []cluster.Replica{
		{Node: "a", URL: "http://a", Generation: 7, Healthy: true},
		{Node: "b", URL: "http://b", Generation: 7, Healthy: true},
	}}
	req := pipeline.Request{Transport: "http", Service: gitexec.UploadPack, StatelessRPC: true}
	rl, err := rt.relayTo(context.Background(), cluster.Replica{Node: "b", URL: url}, req, "app", pl)
	if err != nil {
		t.Fatal(err)
	}
	rl.Relay(context.Background(), req, "app", strings.NewReader(""), io.Discard, io.Discard)
	h := <-headers
	got, ok := decodePlacement(h.Get(hdrPlacement))
	if !ok || got.Primary != "a" || got.Generation != 7 || got.Epoch != 2 || len(got.Replicas) != 2 || got.Replicas[1].URL != "http://b" {
		t.Fatalf("placement carried: %+v (%v), want %+v", got, ok, pl)
	}
	if _, ok := decodePlacement(base64.StdEncoding.EncodeToString([]byte("{}"))); ok {
		t.Fatal("a placement without its repository decoded")
	}

	// The serving node b, its store closed: a read relayed here with the
	// placement is served from its up-to-date copy.
	dir := t.TempDir()
	st, err := store.Open(context.Background(), filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	root := repo.Root{Dir: filepath.Join(dir, "repos")}
	r, err := root.Create(context.Background(), "app")
	if err != nil {
		t.Fatal(err)
	}
	b := &Router{Node: &cluster.Node{DB: st.DB, Name: "b"}, Repos: root}
	relayed := pipeline.Request{Transport: "http", Service: gitexec.UploadPack, StatelessRPC: true, Relayed: true}
	if _, err := b.Route(withPlacement(context.Background(), got), r, false, relayed); err != nil {
		t.Fatalf("relayed read with its placement: %v", err)
	}
	// Without it (or with another repository's), the store is asked.
	if _, err := b.Route(context.Background(), r, false, relayed); err == nil {
		t.Fatal("a relayed read without a placement was routed without the store")
	}
	other := got
	other.Repo = "other"
	if _, err := b.Route(withPlacement(context.Background(), other), r, false, relayed); err == nil {
		t.Fatal("another repository's placement was used")
	}
	// Only a relayed request uses it.
	if _, err := b.Route(withPlacement(context.Background(), got), r, false, pipeline.Request{Transport: "http", Service: gitexec.UploadPack}); err == nil {
		t.Fatal("a client's own request used a carried placement")
	}
}
