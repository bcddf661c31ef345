package server

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"packwire/internal/pipeline"
	"packwire/internal/push"
	"packwire/internal/store"
)

// BenchmarkPublishPush measures what an acknowledged push pays in its
// request path for webhooks and push mirrors (pipeline.OnPush): reading
// the hooks and the repository's config, and with matching hooks the one
// insert of their deliveries. The delivery loop is stopped so that only
// the queueing is measured:
//
//	go test -run '^$' -bench PublishPush -benchtime 2000x ./internal/server
func BenchmarkPublishPush(b *testing.B) {
	for _, hooks := range []int{0, 1, 4} {
		b.Run(fmt.Sprintf("hooks=%d", hooks), func(b *testing.B) {
			s := startServer(b, nil)
			s.stopOutgoing()
			r, err := s.Data.Repos.Create(context.Background(), "team/app")
			if err != nil {
				b.Fatal(err)
			}
			for i := 0; i < hooks; i++ {
				if _, err := s.Data.Store.AddHook(context.Background(), store.Hook{RepoPattern: "team/*", URL: "http://127.0.0.1:9/h", Secret: "s", Events: []string{"push", "ref-delete"}}); err != nil {
					b.Fatal(err)
				}
			}
			ev := pipeline.PushEvent{Repo: r, User: "alice", Transport: "http",
				Refs: []push.Command{{Ref: "refs/heads/main", Old: strings.Repeat("a", 40), New: strings.Repeat("b", 40)}}}
			ctx := context.Background()
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				s.publishPush(ctx, ev)
			}
			b.ReportMetric(float64(time.Since(start).Microseconds())/float64(b.N), "µs/push")
		})
	}
}
