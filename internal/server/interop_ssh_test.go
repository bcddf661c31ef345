package server

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"packwire/internal/fetchcache"
	"packwire/internal/gittest"
	"packwire/internal/governor"
	"packwire/internal/needs"
	"packwire/internal/store"
)

// interopTimeout bounds each libgit2 run: a stalled transfer fails the
// test in this time rather than never (libgit2 1.5 has no timeout of its
// own). A clone of the repositories below takes 1-2 s on a loaded machine.
// JGit runs with a read timeout of 20 s (jgitSource), and the JVM within
// jgitTimeout: JGit took up to 18 s for a clone on a loaded 2-core machine,
// paced or not.
const (
	interopTimeout = 30 * time.Second
	jgitTimeout    = 2 * time.Minute
)

// pygit2Script clones (bare) or fetches origin with libgit2 over SSH, with
// the key given: pygit2 offers no other way to pass a key.
const pygit2Script = `
import sys, pygit2
op, url, path, key = sys.argv[1:5]
class Callbacks(pygit2.RemoteCallbacks):
    def credentials(self, url, username, allowed):
        return pygit2.Keypair(username or "git", key + ".pub", key, "")
    def certificate_check(self, certificate, valid, host):
        return True
if op == "clone":
    pygit2.clone_repository(url, path, bare=True, callbacks=Callbacks())
else:
    pygit2.Repository(path).remotes["origin"].fetch(callbacks=Callbacks())
`

// jgitSource clones (bare) or fetches origin with JGit and its jsch, with
// the key given and a read timeout of 20 s.
const jgitSource = `
import java.io.File;
import com.jcraft.jsch.JSch;
import com.jcraft.jsch.JSchException;
import com.jcraft.jsch.Session;
import org.eclipse.jgit.api.Git;
import org.eclipse.jgit.api.TransportConfigCallback;
import org.eclipse.jgit.transport.*;
import org.eclipse.jgit.util.FS;

public class JGitSSH {
    public static void main(String[] args) throws Exception {
        String op = args[0], url = args[1], path = args[2], key = args[3];
        SshSessionFactory factory = new JschConfigSessionFactory() {
            @Override protected void configure(OpenSshConfig.Host host, Session session) {
                session.setConfig("StrictHostKeyChecking", "no");
            }
            @Override protected JSch createDefaultJSch(FS fs) throws JSchException {
                JSch jsch = super.createDefaultJSch(fs);
                jsch.removeAllIdentity();
                jsch.addIdentity(key);
                return jsch;
            }
        };
        TransportConfigCallback ssh = t -> ((SshTransport) t).setSshSessionFactory(factory);
        if (op.equals("clone")) {
            Git.cloneRepository().setURI(url).setDirectory(new File(path)).setBare(true)
                .setTransportConfigCallback(ssh).setTimeout(20).call().close();
        } else {
            Git.open(new File(path)).fetch().setRemote("origin")
                .setTransportConfigCallback(ssh).setTimeout(20).call();
        }
    }
}
`

// jgitClasspath is JGit 4.11 and what it needs, from Debian's libjgit-java.
var jgitClasspath = []string{"org.eclipse.jgit.jar", "jsch.jar", "javaewah.jar", "slf4j-api.jar", "slf4j-nop.jar"}

// interopClient runs one clone or fetch with a library client.
type interopClient struct {
	name string
	run  func(t *testing.T, op, url, dir string) (string, error)
}

// interopClients are libgit2 (pygit2) and JGit (jsch): clients whose SSH
// libraries return window by rules of their own (see pacedWriter). A
// missing package fails the test: scripts/install-deps installs them.
func interopClients(t *testing.T, s *testServer, key string) []interopClient {
	t.Helper()
	python := "/usr/bin/python3"
	if out, err := exec.Command(python, "-c", "import pygit2").CombinedOutput(); err != nil {
		needs.Missing(t, "pygit2 is not installed (Debian python3-pygit2; scripts/install-deps installs it): %v\n%s", err, out)
	}
	java, err := exec.LookPath("java")
	if err != nil {
		needs.Missing(t, "java is not installed (Debian default-jdk-headless; scripts/install-deps installs it)")
	}
	var cp []string
	for _, jar := range jgitClasspath {
		path := filepath.Join("/usr/share/java", jar)
		if _, err := os.Stat(path); err != nil {
			needs.Missing(t, "%s is missing (Debian libjgit-java; scripts/install-deps installs it)", path)
		}
		cp = append(cp, path)
	}
	classes := t.TempDir()
	src := filepath.Join(classes, "JGitSSH.java")
	if err := os.WriteFile(src, []byte(jgitSource), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("javac", "-cp", strings.Join(cp, ":"), "-d", classes, src).CombinedOutput(); err != nil {
		t.Fatalf("javac (Debian default-jdk-headless; scripts/install-deps installs it): %v\n%s", err, out)
	}
	cp = append(cp, classes)
	run := func(t *testing.T, timeout time.Duration, name string, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Env = append(os.Environ(), "HOME="+s.env.Home)
		start := time.Now()
		out, err := cmd.CombinedOutput()
		if ctx.Err() != nil {
			err = fmt.Errorf("no end within %v: %w", timeout, ctx.Err())
		}
		t.Logf("%s %s: %v", filepath.Base(name), args[len(args)-4], time.Since(start).Round(time.Millisecond))
		return string(out), err
	}
	return []interopClient{
		{"libgit2", func(t *testing.T, op, url, dir string) (string, error) {
			return run(t, interopTimeout, python, "-c", pygit2Script, op, url, dir, key)
		}},
		{"jgit", func(t *testing.T, op, url, dir string) (string, error) {
			return run(t, jgitTimeout, java, "-Duser.home="+s.env.Home, "-cp", strings.Join(cp, ":"), "JGitSSH", op, url, dir, key)
		}},
	}
}

// rsaPEMKey makes an RSA key in PEM, which jsch 0.1.55 and libssh2 1.10
// both read, and registers it for user.
func rsaPEMKey(t *testing.T, s *testServer, user string) string {
	t.Helper()
	key := filepath.Join(s.env.Home, "id_rsa_pem")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-m", "PEM", "-N", "", "-f", key).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	text, err := os.ReadFile(key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	pub, _, _, _, err := gossh.ParseAuthorizedKey(text)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Data.Store.AddKey(context.Background(), user, store.Key{Fingerprint: gossh.FingerprintSHA256(pub), PublicKey: string(text)}); err != nil {
		t.Fatal(err)
	}
	return key
}

// TestLibraryClientsOverSSH: libgit2 and JGit clone a repository of 8 MiB
// of incompressible blobs over SSH three times (the third replayed from
// the fetch cache), then fetch 6 MiB more, with output pacing at its
// default. Each transfer is complete (fsck) and ends within the clients'
// timeout. Before, each stalled: pacing waited once ~512 KiB were
// unacknowledged, and libssh2 and jsch return window only once half their
// window or so is used.
func TestLibraryClientsOverSSH(t *testing.T) {
	// Not in parallel: JGit's 20 s read timeout and the JVM's start (73 s
	// at a load average of 70) failed it beside the parallel tests. Its two
	// clients run one after the other: beside each other, libgit2's fetch
	// missed its 30 s and a JGit clone its 2 min at a load average of 55.
	s := startServer(t, func(c *Config) { c.SSHAddr = "127.0.0.1:0" })
	key := rsaPEMKey(t, s, "alice")
	for _, client := range interopClients(t, s, key) {
		t.Run(client.name, func(t *testing.T) {
			name := "interop/" + client.name
			r, err := s.Data.Repos.Create(context.Background(), name)
			if err != nil {
				t.Fatal(err)
			}
			s.env.Git(r.Path, "config", "core.bigFileThreshold", "512k")
			s.env.Build(r.Path, gittest.Shape{Commits: 1, Files: 8, BlobBytes: 1 << 20, Incompress: true, Seed: 11})
			settle(t, r.Path)
			url := s.sshURL(name)
			var dirs []string
			seq := s.lastSeq(t)
			for i := range 3 {
				dir := filepath.Join(t.TempDir(), "clone")
				if out, err := client.run(t, "clone", url, dir); err != nil {
					t.Fatalf("%s clone %d: %v\n%s", client.name, i+1, err, lastLines(out, 20))
				}
				s.env.Fsck(dir)
				dirs = append(dirs, dir)
			}
			recs := s.recordsAfter(t, seq, func(r []governor.Record) bool { return len(sshRecords(r)) >= 3 })
			if got := sshRecords(recs)[2].PackCache; got != fetchcache.Replayed {
				t.Errorf("the third identical clone was %q, want it replayed from the fetch cache", got)
			}

			s.env.Build(r.Path, gittest.Shape{Ref: "refs/heads/more", Commits: 1, Files: 6, BlobBytes: 1 << 20, Incompress: true, Seed: 12})
			settle(t, r.Path)
			want := s.env.RevParse(r.Path, "refs/heads/more")
			if out, err := client.run(t, "fetch", url, dirs[0]); err != nil {
				t.Fatalf("%s fetch: %v\n%s", client.name, err, lastLines(out, 20))
			}
			// libgit2 fetches into refs/remotes/origin, JGit's bare clone into refs/heads.
			if refs := s.env.Git(dirs[0], "for-each-ref"); !strings.Contains(refs, want+" commit\trefs/remotes/origin/more") && !strings.Contains(refs, want+" commit\trefs/heads/more") {
				t.Fatalf("the fetch did not bring branch more at %s:\n%s", want, refs)
			}
			s.env.Fsck(dirs[0])
			// Paced by the client's own returns: the fallback for clients
			// that return nothing (it stops pacing a command after 1 s
			// without a return) did not have to step in on every command,
			// as it did when pacing waited for returns the client's rule
			// sends only after more data. On a loaded machine a JVM may
			// not read for a second now and then: once or twice is load.
			stopped := 0
			for _, line := range strings.Split(s.logs.String(), "\n") {
				if strings.Contains(line, "output pacing stopped") && strings.Contains(line, name) {
					stopped++
				}
			}
			if commands := 4; stopped >= commands {
				t.Fatalf("pacing gave up on %s on every command (%d of %d):\n%s", client.name, stopped, commands, lastLines(s.logs.String(), 20))
			}
		})
	}
}

// sshRecords are the SSH fetches among recs.
func sshRecords(recs []governor.Record) []governor.Record {
	var out []governor.Record
	for _, r := range recs {
		if r.Transport == "ssh" && r.Kind != "no-op" && r.Kind != "push" {
			out = append(out, r)
		}
	}
	return out
}
