// Package needs is how a test says it cannot run on this machine: a program
// or package is missing, or it needs root. The test fails with what to
// install, so that a run that lacks something never passes by skipping it
// quietly; with PACKWIRE_TEST_ALLOW_SKIP=1 (scripts/test sets it only when
// asked to) it skips with the same words instead.
package needs

import (
	"fmt"
	"os"
	"testing"
)

// AllowSkip is the environment variable that turns the failures into skips.
const AllowSkip = "PACKWIRE_TEST_ALLOW_SKIP"

// Missing fails t (or skips it where AllowSkip is 1) saying what it lacks
// and how to get it.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv(AllowSkip) == "1" {
		t.Skipf("%s (skipped: %s=1)", msg, AllowSkip)
	}
	t.Fatalf("%s (or set %s=1 to skip the tests that need it)", msg, AllowSkip)
}
