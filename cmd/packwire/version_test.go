package main

import (
	"os/exec"
	"strings"
	"testing"
)

// versionLine is what packwire version should print for the test's binary,
// read independently of packwire by `go version -m` from the build
// information the go command stamped into it.
func versionLine(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "version", "-m", binary).Output()
	if err != nil {
		t.Fatalf("go version -m: %v", err)
	}
	lines := strings.Split(string(out), "\n")
	goVersion := strings.TrimSpace(strings.SplitN(lines[0], ":", 2)[1])
	version, settings := "(devel)", map[string]string{}
	for _, l := range lines[1:] {
		f := strings.Split(strings.TrimSpace(l), "\t")
		switch {
		case len(f) >= 3 && f[0] == "mod" && f[2] != "":
			version = f[2]
		case len(f) >= 2 && f[0] == "build":
			if k, v, ok := strings.Cut(f[1], "="); ok {
				settings[k] = v
			}
		}
	}
	var details []string
	if rev := settings["vcs.revision"]; rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if settings["vcs.modified"] == "true" {
			rev += "+dirty"
		}
		details = append(details, "revision "+rev)
	}
	if tm := settings["vcs.time"]; tm != "" {
		details = append(details, tm)
	}
	details = append(details, goVersion)
	return "packwire " + version + " (" + strings.Join(details, ", ") + ")"
}

// TestVersion: packwire version and packwire --version print the module
// version, the VCS revision and time (when the build recorded them) and
// the Go version, as the binary's build information has them: "(devel)"
// for a build that recorded no version, never "dev".
func TestVersion(t *testing.T) {
	want := versionLine(t)
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, code := packwire(t, args...)
		if code != 0 || out != want+"\n" {
			t.Errorf("packwire %s: exit %d %q, want %q", args[0], code, out, want)
		}
	}
	if out, code := packwire(t, "version", "extra"); code != 2 {
		t.Errorf("packwire version extra: exit %d %q, want 2", code, out)
	}
}
