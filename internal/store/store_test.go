package store

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
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

// git-lfs-authenticate makes a 15-minute token per SSH LFS operation:
// DeleteExpiredTokens removes those expired before the cutoff, and only
// those (one without expiry, one still good, one expired after the cutoff
// stay).
func TestDeleteExpiredTokens(t *testing.T) {
	ctx := context.Background()
	st, err := Open(ctx, filepath.Join(t.TempDir(), "packwire.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.DB.Close()
	if _, err := st.AddUser(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for id, expires := range map[string]time.Time{
		"old1": now.Add(-48 * time.Hour), "old2": now.Add(-25 * time.Hour),
		"recent": now.Add(-time.Hour), "good": now.Add(time.Hour), "forever": {},
	} {
		if err := st.AddToken(ctx, "alice", id, []byte("h"), expires, ""); err != nil {
			t.Fatal(err)
		}
	}
	n, err := st.DeleteExpiredTokens(ctx, now.Add(-TokenExpiryGrace))
	if err != nil || n != 2 {
		t.Fatalf("deleted %d, %v; want 2", n, err)
	}
	ts, err := st.Tokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, tok := range ts {
		left = append(left, tok.ID)
	}
	slices.Sort(left)
	if want := []string{"forever", "good", "recent"}; !slices.Equal(left, want) {
		t.Fatalf("tokens left %v, want %v", left, want)
	}
	if n, err := st.DeleteExpiredTokens(ctx, now.Add(-TokenExpiryGrace)); err != nil || n != 0 {
		t.Fatalf("second pass deleted %d, %v", n, err)
	}
}
