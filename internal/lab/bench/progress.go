package bench

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// progress writes the live status: on a terminal one line rewritten in
// place with \r, elsewhere plain lines (at most every few seconds).
type progress struct {
	w       io.Writer
	tty     bool
	mu      sync.Mutex
	lastLen int
	last    time.Time
	lastMsg string
}

func (p *progress) status(line string) {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		pad := ""
		if n := p.lastLen - len(line); n > 0 {
			pad = strings.Repeat(" ", n)
		}
		fmt.Fprint(p.w, "\r"+line+pad)
		p.lastLen = len(line)
		return
	}
	if line == p.lastMsg || time.Since(p.last) < 4*time.Second && strings.SplitN(line, ":", 2)[0] == strings.SplitN(p.lastMsg, ":", 2)[0] {
		return
	}
	fmt.Fprintln(p.w, line)
	p.last, p.lastMsg = time.Now(), line
}

// event prints a line that stays (a phase's summary).
func (p *progress) event(line string) {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.lastLen > 0 {
		fmt.Fprint(p.w, "\r"+strings.Repeat(" ", p.lastLen)+"\r")
		p.lastLen = 0
	}
	fmt.Fprintln(p.w, line)
	p.lastMsg = line
}

func (p *progress) clear() {
	if p == nil || p.w == nil || !p.tty {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lastLen > 0 {
		fmt.Fprint(p.w, "\r"+strings.Repeat(" ", p.lastLen)+"\r")
		p.lastLen = 0
	}
}
