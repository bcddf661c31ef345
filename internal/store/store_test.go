package store

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
)

// Admin commands run while the server runs: two processes (here two
// handles on one file) adding rules at once must both succeed, not fail
// with "database is locked".
func TestConcurrentWritersFromTwoHandles(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "packwire.db")
	a, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer a.DB.Close()
	b, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.DB.Close()
	const each = 25
	var wg sync.WaitGroup
	errs := make(chan error, 2*each)
	for i, s := range []*Store{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < each; j++ {
				_, err := s.InsertRules(ctx, 1, Rule{Allow: true, Ops: "push", RepoPattern: fmt.Sprintf("r%d/%d", i, j), RefPattern: "refs/**", Who: "*"})
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var n int
	if err := a.DB.QueryRow("SELECT COUNT(*) FROM ref_rules").Scan(&n); err != nil || n != 2*each {
		t.Fatalf("rules: %d, %v; want %d", n, err, 2*each)
	}
}
