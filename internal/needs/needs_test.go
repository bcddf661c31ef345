package needs

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestMissing runs a test that calls Missing in a child process, with and
// without AllowSkip: it fails naming what is missing, or skips saying so.
func TestMissing(t *testing.T) {
	if os.Getenv("NEEDS_TEST_CHILD") == "1" {
		Missing(t, "frobnicator is not installed: apt-get install frob")
		return
	}
	for _, tc := range []struct {
		allow    string
		wantCode bool
		want     string
	}{
		{"", true, "--- FAIL"},
		{"1", false, "--- SKIP"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestMissing$", "-test.v")
		cmd.Env = append(os.Environ(), "NEEDS_TEST_CHILD=1", AllowSkip+"="+tc.allow)
		out, err := cmd.CombinedOutput()
		if (err != nil) != tc.wantCode || !strings.Contains(string(out), tc.want) || !strings.Contains(string(out), "frobnicator is not installed") {
			t.Errorf("%s=%q: err %v\n%s", AllowSkip, tc.allow, err, out)
		}
	}
}
