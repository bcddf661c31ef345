package daemon

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestFileConnSendsFileRanges sends a file in two ranges through fileConn
// over loopback TCP (sendfile's path), with a write already on the stream
// before, as a session's replay follows git's advertisement: the client
// gets exactly those bytes, in order, and the file's offset moves with
// what was sent (followers of a growing file rely on it).
func TestFileConnSendsFileRanges(t *testing.T) {
	data := make([]byte, sendFileChunk+123_457) // more than one chunk
	r := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	path := filepath.Join(t.TempDir(), "answer")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		got <- b
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	fc := fileConn{Conn: c, idle: 10 * time.Second}
	if _, err := fc.Write([]byte("0008NAK\n")); err != nil {
		t.Fatal(err)
	}
	first := int64(1000)
	if n, err := fc.StreamFile(f, first); err != nil || n != first {
		t.Fatalf("StreamFile: %d, %v", n, err)
	}
	if off, _ := f.Seek(0, io.SeekCurrent); off != first {
		t.Fatalf("file offset %d after sending %d bytes", off, first)
	}
	rest := int64(len(data)) - first
	if n, err := fc.StreamFile(f, rest); err != nil || n != rest {
		t.Fatalf("StreamFile: %d, %v", n, err)
	}
	// Past the end of what the file holds: a short send is an error.
	if n, err := fc.StreamFile(f, 10); err == nil || n != 0 {
		t.Fatalf("StreamFile past the end: %d, %v", n, err)
	}
	c.Close()
	want := append([]byte("0008NAK\n"), data...)
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("client got %d bytes, want %d (same content: %v)", len(b), len(want), bytes.Equal(b, want))
	}
}
