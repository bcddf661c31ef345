package pipeline

import "time"

// Timeouts are the deadlines of one request. A Call takes them once, at
// Prepare: a reload (SetTimeouts) applies to requests prepared after it,
// and a request already running keeps the ones it started with.
type Timeouts struct {
	// Idle ends a request when no data moved either way for this long
	// (0: never).
	Idle time.Duration
	// Pace bounds how slowly the request itself may arrive.
	Pace Pace
}

// SetTimeouts replaces the timeouts of requests prepared from now on
// (Runner.IdleTimeout and RequestPace are only the values at start).
func (p *Pipeline) SetTimeouts(t Timeouts) { p.timeouts.Store(&t) }

// Timeouts are the timeouts a request prepared now takes.
func (p *Pipeline) Timeouts() Timeouts {
	if t := p.timeouts.Load(); t != nil {
		return *t
	}
	t := Timeouts{Pace: p.RequestPace}
	if p.Runner != nil {
		t.Idle = p.Runner.IdleTimeout
	}
	return t
}

// IdleTimeout is the idle deadline this request took at Prepare, for a
// transport's writes to its client.
func (c *Call) IdleTimeout() time.Duration { return c.timeouts.Idle }
