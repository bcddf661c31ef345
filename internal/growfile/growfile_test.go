package growfile

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// waitResult runs Wait in a goroutine, so that a test can tell a wait
// that returns from one still blocked.
func waitResult(ctx context.Context, g *Growth, need int64) <-chan [3]any {
	ch := make(chan [3]any, 1)
	go func() {
		size, done, err := g.Wait(ctx, need)
		ch <- [3]any{size, done, err}
	}()
	return ch
}

func blocked(t *testing.T, ch <-chan [3]any) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("Wait returned %v; it should still wait", r)
	case <-time.After(50 * time.Millisecond):
	}
}

func returned(t *testing.T, ch <-chan [3]any) [3]any {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return")
		return [3]any{}
	}
}

func TestWaitGrowthEndAndCancel(t *testing.T) {
	g := New()
	ch := waitResult(context.Background(), g, 100)
	g.Grew(50)
	blocked(t, ch)
	g.Grew(40) // sizes never go back
	blocked(t, ch)
	g.Grew(100)
	if r := returned(t, ch); r[0] != int64(100) || r[1] != false {
		t.Fatalf("after growing to 100: %v", r)
	}

	failed := errors.New("killed")
	ch = waitResult(context.Background(), g, 1000)
	blocked(t, ch)
	g.End(120, failed)
	if r := returned(t, ch); r[0] != int64(120) || r[1] != true || r[2] != failed {
		t.Fatalf("after the end: %v", r)
	}

	g = New()
	ctx, cancel := context.WithCancel(context.Background())
	ch = waitResult(ctx, g, 1)
	blocked(t, ch)
	cancel()
	if r := returned(t, ch); r[0] != int64(0) || r[1] != false {
		t.Fatalf("after a cancel: %v", r)
	}
}

func TestWriterBatchesWakeUps(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g := New()
	w := &Writer{F: f, G: g}

	ch := waitResult(context.Background(), g, 1)
	w.Write([]byte("PACK")) // a small write wakes at once
	if r := returned(t, ch); r[0] != int64(4) {
		t.Fatalf("after a small write: %v", r)
	}

	big := make([]byte, 64<<10)
	ch = waitResult(context.Background(), g, 5)
	blocked(t, ch) // the reader waits before the write
	w.Write(big)   // a pipe-sized write waits for more
	blocked(t, ch)
	for range wakeEvery / len(big) {
		w.Write(big)
	}
	if r := returned(t, ch); r[0].(int64) < wakeEvery {
		t.Fatalf("woken at %v bytes, before %d new ones", r[0], wakeEvery)
	}
	if fi, _ := f.Stat(); fi.Size() != 4+int64(len(big))*(1+wakeEvery/int64(len(big))) {
		t.Fatalf("the file holds %d bytes", fi.Size())
	}
}

func TestWatchFollowsAFileWrittenElsewhere(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g := New()
	stop := Watch(f, g, time.Millisecond)
	ch := waitResult(context.Background(), g, 300<<10)
	blocked(t, ch)
	f.Write(make([]byte, 100<<10))
	blocked(t, ch)
	f.Write(make([]byte, 200<<10)) // not small, yet a watched file wakes its readers
	if r := returned(t, ch); r[0] != int64(300<<10) {
		t.Fatalf("after 300 KiB: %v", r)
	}
	stop()
	stop() // a second stop is harmless
	f.Write([]byte("x"))
	time.Sleep(20 * time.Millisecond)
	if size, _, _ := g.State(); size != 300<<10 {
		t.Fatalf("stopped watching, yet the size moved to %d", size)
	}
}
