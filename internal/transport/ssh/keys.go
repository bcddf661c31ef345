package ssh

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"packwire/internal/pipeline"
)

// A connection's identity is its key's owner when it authenticated; a key
// removed since (or its user removed, or the key moved to another user)
// must not go on standing for that user. So each session's command asks
// the store again before anything runs (keyChange), and watchKeys closes
// connections with no command running once the store's version moves and
// their key no longer stands for who they are. The access controller keeps
// key owners while the version stands, so a check costs a version read.

// keyRecheckInterval is how often watchKeys reads the store's version
// (Server.KeyRecheck unless set).
const keyRecheckInterval = 2 * time.Second

// keyChange re-reads who the connection's key stands for and says how that
// changed since authentication ("" when it did not, or without a key).
func (c *conn) keyChange(ctx context.Context) (string, error) {
	if c.keyFingerprint == "" {
		return "", nil
	}
	p, err := c.srv.Access.PrincipalForFingerprint(ctx, c.keyFingerprint)
	if err != nil {
		return "", err
	}
	switch was := c.principal.User; {
	case p.User == was:
		return "", nil
	case p.IsAnonymous():
		return fmt.Sprintf("key %s is no longer registered to %s", c.keyFingerprint, was), nil
	case c.principal.IsAnonymous():
		return fmt.Sprintf("key %s is now registered to %s", c.keyFingerprint, p.User), nil
	default:
		return fmt.Sprintf("key %s now belongs to %s, not %s", c.keyFingerprint, p.User, was), nil
	}
}

// checkKey is keyChange before a command: it revokes the connection when
// the key changed, and returns the refusal to send ("" to go on). A store
// that cannot answer refuses the command as temporarily unavailable, as it
// does a connection whose key it could not look up at authentication.
func (c *conn) checkKey() string {
	if c.unavailable != "" {
		// Its owner was not known at authentication: exec refuses every
		// command as unavailable, without asking the store a second time.
		return ""
	}
	reason, err := c.keyChange(c.ctx)
	if err != nil {
		c.log.Warn("key lookup failed", "error", err.Error())
		return pipeline.StoreUnavailable(err).Message
	}
	if reason == "" {
		return ""
	}
	c.revoke(reason)
	return reason + "; connect again"
}

// revoke marks the connection as no longer its principal's: new channels
// are refused, and it is closed once no command runs and its sessions have
// closed (at once when none is open).
func (c *conn) revoke(reason string) {
	c.mu.Lock()
	if c.revoked != "" {
		c.mu.Unlock()
		return
	}
	c.revoked = reason
	closeNow := c.running == 0
	c.mu.Unlock()
	if closeNow {
		c.log.Info("connection closed", "reason", reason)
		c.ssh.Close()
	} else {
		c.log.Info("connection closes after its command", "reason", reason)
	}
}

func (c *conn) revocation() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.revoked
}

// watchKeys rechecks the key of every open connection each time the
// store's version has moved (every keyRecheckInterval while connections
// are open; a store without versions is asked each time) until stop.
func (s *Server) watchKeys(stop <-chan struct{}) {
	t := time.NewTicker(cmp.Or(s.KeyRecheck, keyRecheckInterval))
	defer t.Stop()
	ctx := context.Background()
	var seen int64
	known := false
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		conns := s.keyedConns()
		if len(conns) == 0 {
			continue
		}
		// Read before the checks: a write during them moves the version
		// again, and the next tick checks again.
		v, ok, err := s.Access.Store.Version(ctx)
		if err != nil || ok && known && v == seen {
			continue
		}
		seen, known = v, ok
		for _, c := range conns {
			if reason, err := c.keyChange(ctx); err == nil && reason != "" {
				c.revoke(reason)
			}
		}
	}
}

// keyedConns are the open connections that authenticated with a key and
// are not revoked yet.
func (s *Server) keyedConns() []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*conn
	for c := range s.conns {
		if c.keyFingerprint != "" && c.revocation() == "" {
			out = append(out, c)
		}
	}
	return out
}
