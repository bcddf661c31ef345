package procgroup

import (
	"bufio"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Kill must reach what the child started, as pack-objects under upload-pack.
func TestKillReachesGrandchild(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 300 & echo $!; wait")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := Start(cmd); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	grandchild, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("grandchild pid %q: %v", line, err)
	}
	Kill(cmd)
	cmd.Wait()
	// The grandchild goes to init, which reaps it; until then it is a zombie.
	deadline := time.Now().Add(10 * time.Second)
	for {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(grandchild) + "/stat")
		if err != nil {
			return // gone
		}
		if _, after, ok := strings.Cut(string(stat), ") "); ok && strings.HasPrefix(after, "Z") {
			return // dead, not yet reaped
		}
		if time.Now().After(deadline) {
			syscall.Kill(grandchild, syscall.SIGKILL) // Kill missed it: do not leave it behind
			t.Fatalf("grandchild %d still running 10 s after Kill: %s", grandchild, stat)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
