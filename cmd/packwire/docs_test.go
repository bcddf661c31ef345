package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestReferenceMatchesHelp: docs/reference.md is what packwire docs
// reference prints now, so it says what every command's --help says (run
// go generate ./cmd/packwire after changing a command or a flag); and the
// help it is made from is the real binary's.
func TestReferenceMatchesHelp(t *testing.T) {
	for _, v := range docsEnvVars {
		t.Setenv(v, "")
	}
	path := filepath.Join("..", "..", "docs", "reference.md")
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ref := referenceMarkdown(context.Background())
	if string(file) != ref {
		fileLines, refLines := strings.Split(string(file), "\n"), strings.Split(ref, "\n")
		for i := 0; i < len(fileLines) || i < len(refLines); i++ {
			var a, b string
			if i < len(fileLines) {
				a = fileLines[i]
			}
			if i < len(refLines) {
				b = refLines[i]
			}
			if a != b {
				t.Fatalf("docs/reference.md differs from --help at line %d (run go generate ./cmd/packwire):\nfile: %q\nhelp: %q", i+1, a, b)
			}
		}
	}
	for _, words := range leaves() {
		cmd := exec.Command(binary, append(words, "--help")...)
		cmd.Env = os.Environ()
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s --help: %v", strings.Join(words, " "), err)
		}
		if !strings.Contains(ref, "```text\n"+string(out)+"```\n") {
			t.Errorf("the reference does not hold packwire %s --help verbatim", strings.Join(words, " "))
		}
	}
}

// TestManPage: packwire docs man writes a page man(1) renders without
// warnings, with a section for every command and every flag of serve.
func TestManPage(t *testing.T) {
	page, stderr, code := pw(t, "", nil, "docs", "man")
	if code != 0 || stderr != "" || !strings.HasPrefix(page, ".TH PACKWIRE 1 ") {
		t.Fatalf("docs man: exit %d %q\n%.200s", code, stderr, page)
	}
	for _, words := range leaves() {
		if !strings.Contains(page, `.SS "packwire `+roffText(strings.Join(words, " "))) {
			t.Errorf("no section for packwire %s", strings.Join(words, " "))
		}
	}
	serve, _, _ := pw(t, "", nil, "serve", "--help")
	for _, f := range parseHelp(serve).flags {
		name, _, _ := strings.Cut(f.spec, " ")
		if !strings.Contains(page, `.TP`+"\n"+`\fB`+roffText(name)+`\fR`) {
			t.Errorf("serve's %s is not in the man page", name)
		}
	}
	groff, err := exec.LookPath("groff")
	if err != nil {
		t.Fatalf("groff is not installed (apt-get install groff-base): the page cannot be checked")
	}
	render := exec.Command(groff, "-man", "-Tutf8", "-ww", "-z")
	render.Stdin = strings.NewReader(page)
	if out, err := render.CombinedOutput(); err != nil || len(out) > 0 {
		t.Fatalf("groff -man -ww: %v\n%s", err, out)
	}
}
