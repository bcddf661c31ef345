package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"packwire/internal/gittest"
)

// TestAccessCommandsHelp: every access command answers --help with its
// real synopsis, and the top-level usage lists it.
func TestAccessCommandsHelp(t *testing.T) {
	top, code := packwire(t, "help")
	if code != 0 {
		t.Fatalf("help: %d", code)
	}
	for _, c := range [][]string{
		{"grant"}, {"revoke"}, {"grants"}, {"anonymous-read"}, {"protect"},
		{"rule", "add"}, {"rule", "list"}, {"rule", "remove"},
		{"key", "add"}, {"key", "remove"}, {"key", "list"},
		{"token", "create"}, {"token", "revoke"}, {"token", "list"},
		{"access", "export"}, {"access", "import"},
		{"user", "add"}, {"user", "list"}, {"user", "remove"},
	} {
		name := strings.Join(c, " ")
		out, code := packwire(t, append(c, "--help")...)
		if code != 0 || !strings.HasPrefix(out, "usage: packwire "+name) || !strings.Contains(out, "-data") {
			t.Errorf("%s --help: %d\n%s", name, code, out)
		}
		if !strings.Contains(top, "  "+name) {
			t.Errorf("top-level usage does not list %q", name)
		}
	}
}

func TestAccessCommands(t *testing.T) {
	env := gittest.New(t)
	data := newData(t)
	key := env.NewSSHKey("k1")
	run := func(want int, args ...string) string {
		t.Helper()
		out, code := packwire(t, append(args, "--data", data)...)
		if code != want {
			t.Fatalf("packwire %s: exit %d, want %d\n%s", strings.Join(args, " "), code, want, out)
		}
		return out
	}
	run(0, "user", "add", "alice", "--key", key+".pub")
	run(0, "user", "add", "bob")
	if out := run(0, "grant", "alice", "write", "team/*"); !strings.Contains(out, "alice has write on team/*") {
		t.Fatal(out)
	}
	run(0, "grant", "bob", "admin", "**")
	run(2, "grant", "alice", "owner", "team/*")
	run(2, "grant", "alice", "read", "team/../x")
	run(1, "grant", "nobody", "read", "x")
	if out := run(0, "grants"); !strings.Contains(out, "alice  write  team/*") || !strings.Contains(out, "bob    admin  **") {
		t.Fatalf("grants:\n%s", out)
	}
	run(0, "revoke", "bob", "**")
	run(1, "revoke", "bob", "**")

	run(0, "anonymous-read", "off")
	run(0, "anonymous-read", "on", "pub/**")
	if out := run(0, "anonymous-read"); out != "server-wide: off\npub/**: on\n" {
		t.Fatalf("anonymous-read:\n%q", out)
	}
	run(2, "anonymous-read", "maybe")

	run(0, "rule", "add", "deny", "create", "team/*", "refs/tags/**", "*")
	run(0, "protect", "team/app", "refs/heads/main")
	run(0, "rule", "add", "--at", "2", "allow", "force", "team/app", "refs/heads/wip/*", "alice")
	run(2, "rule", "add", "deny", "rename", "team/*", "refs/**", "*")
	run(2, "rule", "add", "deny", "push", "team/*", "refs/**", "role:owner")
	want := "#1 allow force-push,delete team/app refs/heads/main role:admin\n" +
		"#2 allow force-push team/app refs/heads/wip/* alice\n" +
		"#3 deny force-push,delete team/app refs/heads/main *\n" +
		"#4 deny create team/* refs/tags/** *\n"
	if out := run(0, "rule", "list"); out != want {
		t.Fatalf("rule list:\n%s\nwant:\n%s", out, want)
	}
	run(0, "rule", "remove", "2")
	run(1, "rule", "remove", "9")
	if out := run(0, "rule", "list"); !strings.HasPrefix(out, "#1 allow") || !strings.Contains(out, "#3 deny create") {
		t.Fatalf("after remove:\n%s", out)
	}

	out := run(0, "token", "create", "alice", "--expires", "1h")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	token := lines[len(lines)-1]
	// The secret is base64url and may itself contain "_": split only twice.
	parts := strings.SplitN(token, "_", 3)
	id, secret := parts[1], parts[2]
	list := run(0, "token", "list")
	if !strings.Contains(list, id) || strings.Contains(list, token) || strings.Contains(list, secret) {
		t.Fatalf("token list shows a secret or misses the id:\n%s", list)
	}
	run(0, "token", "revoke", id)
	if list := run(0, "token", "list", "alice"); !regexp.MustCompile(id + `\s+alice\s+\S+\s+\S+\s+20\d\d-`).MatchString(list) {
		t.Fatalf("revoked token not shown revoked:\n%s", list)
	}
	run(1, "token", "revoke", "ffffffffffffffff")

	// export -> import round trip, into a fresh data directory too.
	exported := run(0, "access", "export")
	if strings.Contains(exported, secret) {
		t.Fatal("export contains a token secret")
	}
	file := filepath.Join(t.TempDir(), "model.toml")
	os.WriteFile(file, []byte(exported), 0o600)
	run(0, "access", "import", file)
	if again := run(0, "access", "export"); again != exported {
		t.Fatalf("round trip changed the model:\n%s\n---\n%s", exported, again)
	}
	other := newData(t)
	if out, code := packwire(t, "access", "import", file, "--data", other); code != 0 {
		t.Fatalf("import into a new data dir: %s", out)
	}
	out2, _ := packwire(t, "access", "export", "--data", other)
	strip := regexp.MustCompile(`(?s)\[\[token\]\].*`)
	if strip.ReplaceAllString(out2, "") != strip.ReplaceAllString(exported, "") {
		t.Fatalf("fresh import differs:\n%s\n---\n%s", exported, out2)
	}

	// Unknown keys are rejected with their line.
	bad := strings.Replace(exported, "[[rule]]\n", "[[rule]]\nwho_else = \"x\"\n", 1)
	os.WriteFile(file, []byte(bad), 0o600)
	lineNo := 0
	for i, l := range strings.Split(bad, "\n") {
		if strings.HasPrefix(l, "who_else") {
			lineNo = i + 1
		}
	}
	out = run(1, "access", "import", file)
	if !strings.Contains(out, "line "+itoa(lineNo)+": unknown key \"rule.who_else\"") {
		t.Fatalf("unknown key: want line %d:\n%s", lineNo, out)
	}
	os.WriteFile(file, []byte("anonymous_read = \"on\"\nanonymous_reads = \"off\"\n"), 0o600)
	if out := run(1, "access", "import", file); !strings.Contains(out, "line 2: unknown key") {
		t.Fatalf("top-level unknown key:\n%s", out)
	}
	// A failed import changed nothing.
	if again := run(0, "access", "export"); again != exported {
		t.Fatal("failed import changed the model")
	}

	// key remove by file and by fingerprint.
	run(0, "key", "remove", key+".pub")
	run(1, "key", "remove", key+".pub")
	run(0, "key", "add", "alice", key+".pub")
	fp := strings.Fields(run(0, "key", "list", "alice"))[1]
	run(0, "key", "remove", fp)
	if out := run(0, "key", "list"); out != "" {
		t.Fatalf("keys left: %s", out)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestAccessImportSafety: --dry-run lists every kind of change and makes
// none; an import that would remove users is refused, naming them, unless
// --prune; a rule naming a user the file does not have is refused.
func TestAccessImportSafety(t *testing.T) {
	env := gittest.New(t)
	data := newData(t)
	key := env.NewSSHKey("k1")
	run := func(want int, args ...string) string {
		t.Helper()
		out, code := packwire(t, append(args, "--data", data)...)
		if code != want {
			t.Fatalf("packwire %s: exit %d, want %d\n%s", strings.Join(args, " "), code, want, out)
		}
		return out
	}
	run(0, "user", "add", "alice", "--key", key+".pub")
	run(0, "user", "add", "bob")
	run(0, "grant", "alice", "write", "team/*")
	run(0, "grant", "bob", "read", "**")
	run(0, "protect", "team/*", "refs/heads/main")
	run(0, "anonymous-read", "on", "pub/**")
	run(0, "token", "create", "bob")
	run(0, "token", "create", "bob")
	before := run(0, "access", "export")
	file := filepath.Join(t.TempDir(), "model.toml")
	write := func(text string) {
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	// The reported incident: a file holding only a rule.
	write("[[rule]]\naction = \"deny\"\nops = [\"delete\"]\nrepo = \"**\"\nref = \"refs/tags/**\"\nwho = \"role:write\"\n")
	out := run(1, "access", "import", file)
	if !strings.Contains(out, "refused: it would remove users alice, bob (with 2 tokens, their keys and grants); pass --prune") {
		t.Fatalf("import removing users:\n%s", out)
	}
	if after := run(0, "access", "export"); after != before {
		t.Fatalf("a refused import changed the model:\n%s", after)
	}

	// A dry run lists each kind of change and changes nothing.
	edited := strings.Replace(before, "anonymous_read = \"on\"", "anonymous_read = \"off\"", 1)
	edited = strings.Replace(edited, "role = \"write\"", "role = \"admin\"", 1) // alice's grant
	edited = strings.Replace(edited, "[[user]]\nname = \"bob\"\nkeys = []\n", "[[user]]\nname = \"carol\"\nkeys = []\n", 1)
	edited = strings.Replace(edited, "[[grant]]\nuser = \"bob\"", "[[grant]]\nuser = \"carol\"", 1)
	edited = strings.Replace(edited, "repo = \"pub/**\"", "repo = \"oss/**\"", 1)
	edited = regexp.MustCompile(`(?s)\n\[\[token\]\]\n.*`).ReplaceAllString(edited, "\n")
	edited += "[[rule]]\naction = \"allow\"\nops = [\"create\"]\nrepo = \"team/*\"\nref = \"refs/tags/**\"\nwho = \"carol\"\n"
	write(edited)
	out = run(0, "access", "import", "--dry-run", file)
	for _, want := range []string{
		"would make ", "~ anonymous-read server-wide: on -> off", "+ anonymous-read oss/**: on", "- anonymous-read pub/**: on",
		"+ user carol", "- user bob", "- token ", " of bob", "~ grant alice on team/*: write -> admin", "+ grant carol read **",
		"- grant bob read **", "+ rule #3 allow create team/* refs/tags/** carol", "(users would be removed: the import needs --prune)",
		"dry run: nothing changed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "- token ") != 2 || strings.Contains(out, "rule #1") {
		t.Errorf("dry run: want bob's 2 tokens and no change to the unchanged rules:\n%s", out)
	}
	if after := run(0, "access", "export"); after != before {
		t.Fatalf("--dry-run changed the model:\n%s", after)
	}
	// Keys too.
	keyed := regexp.MustCompile(`keys = \["ssh-[^"]*"\]`).ReplaceAllString(before, "keys = []")
	write(keyed)
	if out := run(0, "access", "import", "--dry-run", file); !strings.Contains(out, "- key alice SHA256:") {
		t.Errorf("dry run does not show a removed key:\n%s", out)
	}

	run(1, "access", "import", file[:len(file)-5]+".none")
	write(edited)
	run(1, "access", "import", file)
	out = run(0, "access", "import", "--prune", file)
	if !strings.Contains(out, "- user bob") || !strings.Contains(out, "imported 2 users") {
		t.Fatalf("import --prune:\n%s", out)
	}
	if users := run(0, "user", "list"); users != "alice\ncarol\n" {
		t.Fatalf("users after --prune: %q", users)
	}
	if list := run(0, "token", "list"); strings.Contains(list, "bob") {
		t.Fatalf("bob's tokens survived:\n%s", list)
	}
	if out := run(0, "access", "import", file); !strings.Contains(out, "no changes") {
		t.Fatalf("importing the same file again:\n%s", out)
	}

	// A rule naming a user the file does not have is refused, as a grant is.
	write(edited + "[[rule]]\naction = \"deny\"\nops = [\"push\"]\nrepo = \"**\"\nref = \"**\"\nwho = \"dave\"\n")
	if out := run(1, "access", "import", "--prune", file); !strings.Contains(out, `rule 4: no user "dave" in the file`) {
		t.Fatalf("rule for a missing user:\n%s", out)
	}
	if out := run(1, "access", "import", "--dry-run", file); !strings.Contains(out, `no user "dave"`) {
		t.Fatalf("dry run of a rule for a missing user:\n%s", out)
	}
}
