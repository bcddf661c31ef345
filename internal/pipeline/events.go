package pipeline

import (
	"context"
	"strings"
	"time"

	"packwire/internal/gitexec"
	"packwire/internal/push"
	"packwire/internal/repo"
)

// PushEvent is a push that wrote refs, as the client's report says.
type PushEvent struct {
	Repo      repo.Repo
	User      string // "": anonymous
	Transport string
	Refs      []push.Command // the refs written, in the client's order
}

// announceTimeout bounds what OnPush may take: it queues one row.
const announceTimeout = 10 * time.Second

// announcePush tells OnPush about the refs a push wrote: those the
// report the client got says "ok" for (every kept one when the client
// asked for no report and git succeeded). Called once the report is sent;
// refs git wrote count even if the client left before reading it.
func (c *Call) announcePush(ctx context.Context, kept []push.Command, report []string, res gitexec.Result) {
	p := c.p
	// A node replicating to this one: the node the client pushed to
	// announces it.
	if p.OnPush == nil || c.Request.Principal.IsCluster() {
		return
	}
	written := writtenRefs(kept, report, res.ExitCode == 0)
	if len(written) == 0 {
		return
	}
	// The client may be gone: the refs were written all the same.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), announceTimeout)
	defer cancel()
	p.OnPush(ctx, PushEvent{Repo: c.Repo, User: c.Request.Principal.User, Transport: c.Request.Transport, Refs: written})
}

// writtenRefs are the kept commands the report acknowledges.
func writtenRefs(kept []push.Command, report []string, gitOK bool) []push.Command {
	if report == nil {
		if gitOK {
			return kept
		}
		return nil
	}
	ok := map[string]bool{}
	for _, l := range report {
		if ref, found := strings.CutPrefix(strings.TrimSuffix(l, "\n"), "ok "); found {
			ok[ref] = true
		}
	}
	var out []push.Command
	for _, cmd := range kept {
		if ok[cmd.Ref] {
			out = append(out, cmd)
		}
	}
	return out
}

// readOnlyRefusal says why the repository takes no push ("": it takes them).
func (p *Pipeline) readOnlyRefusal(r repo.Repo) string {
	if p.PushRefusal == nil {
		return ""
	}
	return p.PushRefusal(r)
}
