package ssh

import (
	"strings"
	"testing"
)

func TestParseCommand(t *testing.T) {
	good := []struct{ cmd, service, path string }{
		{"git-upload-pack '/team/app.git'", "git-upload-pack", "/team/app.git"},
		{"git-receive-pack 'team/app.git'", "git-receive-pack", "team/app.git"},
		{"git-upload-archive '/team/app.git'", "git-upload-archive", "/team/app.git"},
		{"git upload-pack '/team/app.git'", "git-upload-pack", "/team/app.git"},
		{"git receive-pack 'team/app'", "git-receive-pack", "team/app"},
		{"git-upload-pack /team/app.git", "git-upload-pack", "/team/app.git"},
		{"git-upload-pack team_1/app-2.git", "git-upload-pack", "team_1/app-2.git"},
		{"git-upload-pack '~/x'", "git-upload-pack", "~/x"},   // the pipeline refuses it
		{"git-upload-pack '../x'", "git-upload-pack", "../x"}, // the pipeline refuses it
	}
	for _, tc := range good {
		service, path, err := ParseCommand(tc.cmd)
		if err != nil || service != tc.service || path != tc.path {
			t.Errorf("ParseCommand(%q) = %q, %q, %v; want %q, %q", tc.cmd, service, path, err, tc.service, tc.path)
		}
	}
	bad := []string{
		"",
		"git-upload-pack",
		"git-upload-pack ",
		"git-upload-pack ''",
		"git-upload-pack 'x'; id",
		"git-upload-pack 'x' ; id",
		"git-upload-pack 'x' extra",
		"git-upload-pack 'x' 'y'",
		"git-upload-pack x y",
		"git-upload-pack  'x'",
		"git-upload-pack 'x",
		"git-upload-pack 'te''am'", // git's sq_dequote refuses this too
		"git-upload-pack x'",
		"git-upload-pack 'x'\n",
		"git-upload-pack 'x\ny'",
		"git-upload-pack 'x\x00y'",
		"git-upload-pack $(id)",
		"git-upload-pack `id`",
		"git-upload-pack 'x' | cat",
		"git-upload-pack 'x' && id",
		"git-upload-pack x;id",
		"git-upload-pack 'a'\\''b'", // a quote in the path
		"git-upload-pack 'a'\\!'b'", // a '!' in the path
		"git-upload-pack 'a'\\x'b'", // only ' and ! may be escaped
		"git-upload-pack 'a'\\'",    // an escape must resume quoting
		"git-upload-pack '$HOME'",
		"git-upload-pack 'a b'",
		"upload-pack 'x'",
		"git-upload-packx 'x'",
		"git-git-upload-pack 'x'",
		"git git-upload-pack 'x'",
		"git  upload-pack 'x'",
		"git upload-pack",
		"git-shell -c 'git-upload-pack x'",
		"sh -c 'id'",
		"scp -f /etc/passwd",
		"git-upload-pack " + strings.Repeat("a", maxCommandLen),
	}
	for _, cmd := range bad {
		if service, path, err := ParseCommand(cmd); err == nil {
			t.Errorf("ParseCommand(%q) = %q, %q; want an error", cmd, service, path)
		}
	}
}

// TestSqDequoteMatchesGit checks the escapes as git's sq_quote_buf writes
// them (quote.c), even though isSafePath then refuses such paths.
func TestSqDequoteMatchesGit(t *testing.T) {
	for quoted, want := range map[string]string{
		`'a'`:          "a",
		`'a'\''b'`:     "a'b",
		`'a'\!'b'`:     "a!b",
		`''\''x'\!''`:  "'x!",
		`'with space'`: "with space",
	} {
		if got, ok := sqDequote(quoted); !ok || got != want {
			t.Errorf("sqDequote(%s) = %q, %v; want %q", quoted, got, ok, want)
		}
	}
}

func FuzzParseCommand(f *testing.F) {
	for _, seed := range []string{
		"git-upload-pack '/team/app.git'", "git upload-pack 'team/app.git'", "git-receive-pack 'a'\\''b'",
		"git-upload-pack 'x'; id", "git-upload-archive x", "git-upload-pack '~/x'", "git-upload-pack 'a'\\!'b'",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, cmd string) {
		service, path, err := ParseCommand(cmd)
		if err != nil {
			return
		}
		if service != "git-upload-pack" && service != "git-receive-pack" && service != "git-upload-archive" {
			t.Fatalf("ParseCommand(%q): service %q", cmd, service)
		}
		if path == "" || strings.ContainsAny(path, "'\"\\\x00\n\r\t ;|&$`<>(){}[]*?!#%^=") {
			t.Fatalf("ParseCommand(%q): unsafe path %q", cmd, path)
		}
	})
}
