//go:build linux

package main

import (
	"bufio"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"packwire/internal/gittest"
)

// TestDebianPackage builds the package with scripts/build-deb (from the
// binary TestMain built), installs it with dpkg -i, starts the server as
// the unit would (its ExecStart, as the packwire user, with the unit's
// environment; systemd is not PID 1 here) on ports of its own, clones from
// it, then checks dpkg -r keeps the data and the configuration and dpkg
// --purge leaves none of the package's files. It installs into this
// machine's /usr, so it runs as root only (CI does).
func TestDebianPackage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("installs a package: root only")
	}
	for _, tool := range []string{"dpkg", "dpkg-deb", "adduser"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed: not a Debian system", tool)
		}
	}
	if out, err := exec.Command("dpkg-query", "-W", "-f=${Status}", "packwire").Output(); err == nil && strings.Contains(string(out), "installed") {
		t.Skip("a packwire package is installed on this machine already: not touching it")
	}
	if _, err := os.Stat("/usr/bin/packwire"); err == nil {
		t.Skip("/usr/bin/packwire exists and belongs to no package: not touching it")
	}
	run := func(name string, args ...string) string {
		t.Helper()
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return string(out)
	}
	out := run("../../scripts/build-deb", "--binary", binary, "--version", "0.0~test", "--out", t.TempDir())
	deb := strings.TrimSpace(out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:])
	t.Cleanup(func() { exec.Command("dpkg", "--purge", "packwire").Run() })
	run("dpkg", "-i", deb)
	files := strings.Fields(run("dpkg-query", "-L", "packwire"))

	for _, f := range []string{"/usr/bin/packwire", "/lib/systemd/system/packwire.service", "/lib/systemd/system/packwire.socket",
		"/etc/packwire/packwire.toml", "/usr/share/man/man1/packwire.1.gz"} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("installed package lacks %s: %v", f, err)
		}
	}
	u, err := user.Lookup("packwire")
	if err != nil {
		t.Fatalf("no packwire user after install: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if fi, err := os.Stat("/var/lib/packwire"); err != nil || fi.Sys().(*syscall.Stat_t).Uid != uint32(uid) {
		t.Fatalf("/var/lib/packwire is not the packwire user's: %v", err)
	}

	// The unit's ExecStart and Environment=, run as its User=.
	unit, _ := os.ReadFile("/lib/systemd/system/packwire.service")
	var argv, envs []string
	for _, line := range strings.Split(string(unit), "\n") {
		if v, ok := strings.CutPrefix(line, "ExecStart="); ok {
			argv = strings.Fields(v)
		}
		if v, ok := strings.CutPrefix(line, "Environment="); ok {
			envs = append(envs, v)
		}
	}
	if len(argv) == 0 || argv[0] != "/usr/bin/packwire" {
		t.Fatalf("ExecStart is %v, want /usr/bin/packwire ...", argv)
	}
	asPackwire := func(args ...string) *exec.Cmd {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, envs...)
		cmd.Dir = "/var/lib/packwire"
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		return cmd
	}
	for _, args := range [][]string{{"init"}, {"repo", "create", "r"}} {
		if out, err := asPackwire(append([]string{"/usr/bin/packwire"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("packwire %v as packwire: %v\n%s", args, err, out)
		}
	}
	// Ports of its own: the defaults may be taken on a shared machine.
	serve := asPackwire(append(argv, "--git", "127.0.0.1:0", "--http", "127.0.0.1:0", "--ssh", "")...)
	stdout, _ := serve.StdoutPipe()
	serve.Stderr = os.Stderr
	dieWithTest(serve)
	serve.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	addr := ""
	sc := bufio.NewScanner(stdout)
	for addr == "" && sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 4 && f[0] == "git://" {
			addr = f[3]
		}
	}
	go func() {
		for sc.Scan() {
		}
	}()
	if addr == "" {
		serve.Process.Kill()
		serve.Wait()
		t.Fatal("the service did not print its git:// address")
	}
	env := gittest.New(t)
	if out, err := env.Run("", nil, "clone", "git://"+addr+"/r", filepath.Join(t.TempDir(), "c")); err != nil {
		t.Errorf("clone from the installed service: %v\n%s", err, out)
	}
	serve.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- serve.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("the service exited with %v after SIGTERM", err)
		}
	case <-time.After(time.Minute):
		serve.Process.Kill()
		t.Fatal("the service did not exit after SIGTERM")
	}

	run("dpkg", "-r", "packwire")
	for _, f := range []string{"/var/lib/packwire/repos/r.git", "/etc/packwire/packwire.toml"} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("dpkg -r removed %s: %v", f, err)
		}
	}
	if _, err := os.Stat("/usr/bin/packwire"); err == nil {
		t.Error("dpkg -r left /usr/bin/packwire")
	}
	run("dpkg", "--purge", "packwire")
	for _, f := range append(files, "/var/lib/packwire", "/etc/packwire") {
		fi, err := os.Stat(f)
		if err != nil {
			continue
		}
		if fi.IsDir() && f != "/var/lib/packwire" && f != "/etc/packwire" && !strings.Contains(f, "packwire") {
			continue // a directory the system shares (/usr/bin)
		}
		t.Errorf("dpkg --purge left %s", f)
	}
}
