package benchkit

import (
	"bytes"
	"fmt"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Server is a server under benchmark, in its own cgroup. The Start
// functions register it until it is stopped, so that Fatalf and
// StopOnSignal stop it.
type Server struct {
	Port  string
	Group *Group
	stop  func()
	once  sync.Once
}

// running are the servers started and not yet stopped, oldest first, for
// Fatalf and StopOnSignal.
var (
	runningMu sync.Mutex
	running   []*Server
)

func register(s *Server) *Server {
	runningMu.Lock()
	defer runningMu.Unlock()
	running = append(running, s)
	return s
}

// Stop ends the server and everything it started. Only the first call
// stops it; the others wait until it has stopped.
func (s *Server) Stop() {
	if s == nil {
		return
	}
	s.once.Do(func() {
		if s.stop != nil {
			s.stop()
		}
		runningMu.Lock()
		defer runningMu.Unlock()
		if i := slices.Index(running, s); i >= 0 {
			running = slices.Delete(running, i, i+1)
		}
	})
}

// stopAll stops every running server, newest first.
func stopAll() {
	for {
		runningMu.Lock()
		if len(running) == 0 {
			runningMu.Unlock()
			return
		}
		s := running[len(running)-1]
		runningMu.Unlock()
		s.Stop()
	}
}

// Fatalf stops every running server, newest first, then exits like
// log.Fatalf: no server or cgroup outlives a failed run.
func Fatalf(format string, args ...any) {
	stopAll()
	log.Fatalf(format, args...)
}

// StopOnSignal makes SIGINT and SIGTERM stop every running server and
// exit with status 130. Programs call it once, at start.
func StopOnSignal() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		log.Printf("%v: stopping servers", <-sig)
		stopAll()
		os.Exit(130)
	}()
}

// EnsureTools installs the Debian packages that provide the missing
// programs (program -> package) with apt-get, waiting for the dpkg lock when
// someone else is installing, and puts /usr/sbin on PATH.
func EnsureTools(programs map[string]string) {
	if !strings.Contains(os.Getenv("PATH"), "/usr/sbin") {
		os.Setenv("PATH", os.Getenv("PATH")+":/usr/sbin")
	}
	var missing []string
	for prog, pkg := range programs {
		if _, err := exec.LookPath(prog); err != nil {
			missing = append(missing, pkg)
		}
	}
	if len(missing) == 0 {
		return
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		Fatalf("missing packages %s and no apt-get to install them: install them and rerun", strings.Join(missing, ", "))
	}
	log.Printf("installing %s ...", strings.Join(missing, ", "))
	for try := 0; ; try++ {
		cmd := exec.Command("apt-get", append([]string{"install", "-y", "-o", "DPkg::Lock::Timeout=300"}, missing...)...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		b, err := cmd.CombinedOutput()
		if err == nil {
			break
		}
		if try < 10 && bytes.Contains(b, []byte("lock")) {
			log.Printf("dpkg lock busy (someone else installs); retrying in 15 s")
			time.Sleep(15 * time.Second)
			continue
		}
		if try < 1 && bytes.Contains(b, []byte("Unable to locate")) {
			exec.Command("apt-get", "update").Run()
			continue
		}
		Fatalf("could not install %s: %v\n%s", strings.Join(missing, ", "), err, b)
	}
	for prog := range programs {
		if _, err := exec.LookPath(prog); err != nil {
			Fatalf("%s still missing after apt-get install", prog)
		}
	}
}

// waitFile waits up to 5 s for a path to appear (a socket a server makes).
func waitFile(path string) {
	for i := 0; i < 100; i++ {
		if _, err := os.Stat(path); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stopper signals cmds, waits up to 5 s, then kills what is left of the group.
func stopper(g *Group, sig syscall.Signal, logf *os.File, cmds ...*exec.Cmd) func() {
	return func() {
		for _, c := range cmds {
			c.Process.Signal(sig)
		}
		done := make(chan struct{})
		go func() {
			for _, c := range cmds {
				c.Wait()
			}
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
		g.Close() // kills what is left: workers, CGI children, git
		<-done
		if logf != nil {
			logf.Close()
		}
	}
}

// ShareRepos makes data a packwire data directory whose repos is a symlink
// to repos: a second packwire server over the same repositories.
func ShareRepos(data, repos string) {
	if err := os.MkdirAll(data, 0o755); err != nil {
		Fatalf("%v", err)
	}
	if err := os.Symlink(repos, filepath.Join(data, "repos")); err != nil {
		Fatalf("%v", err)
	}
}

// StartPackwire runs `bin serve --data data ARGS...` in its own group;
// port is the port the caller gave it (for WaitPort), "" to not wait.
func StartPackwire(name, bin, data, logPath, port string, args ...string) *Server {
	g := NewGroup(name)
	cmd := g.Command(bin, append([]string{"serve", "--data", data, "--log-format", "json"}, args...)...)
	logf, _ := os.Create(logPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		g.Close()
		Fatalf("%v", err)
	}
	s := register(&Server{Port: port, Group: g, stop: stopper(g, syscall.SIGTERM, logf, cmd)})
	if port != "" {
		WaitPort(port)
	}
	return s
}

// StartGitDaemon serves every repository under base over git:// with
// `git daemon` (its default limits, as users run it). It runs git-daemon
// directly: the `git daemon` wrapper would orphan it.
func StartGitDaemon(name, base string, env []string) *Server {
	g := NewGroup(name)
	port := FreePort()
	cmd := g.Command("/usr/lib/git-core/git-daemon", "--export-all", "--reuseaddr", "--base-path="+base,
		"--listen=127.0.0.1", "--port="+port, base)
	cmd.Env = env
	if err := cmd.Start(); err != nil {
		g.Close()
		Fatalf("%v", err)
	}
	s := register(&Server{Port: port, Group: g, stop: stopper(g, syscall.SIGTERM, nil, cmd)})
	WaitPort(port)
	return s
}

const nginxConf = `daemon off;
master_process on;
worker_processes 2;
user root;
pid {{DIR}}/nginx.pid;
error_log {{DIR}}/error.log warn;
worker_rlimit_nofile 8192;
events { worker_connections 4096; }
http {
	access_log off;
	client_body_temp_path {{DIR}}/tmp/body;
	fastcgi_temp_path {{DIR}}/tmp/fastcgi;
	proxy_temp_path {{DIR}}/tmp/proxy;
	uwsgi_temp_path {{DIR}}/tmp/uwsgi;
	scgi_temp_path {{DIR}}/tmp/scgi;
	server {
		listen 127.0.0.1:{{PORT}};
		client_max_body_size 0;
		location / {
			fastcgi_pass unix:{{SOCK}};
			fastcgi_param SCRIPT_FILENAME /usr/lib/git-core/git-http-backend;
			fastcgi_param GIT_PROJECT_ROOT {{REPOS}};
			fastcgi_param GIT_HTTP_EXPORT_ALL 1;
			fastcgi_param PATH_INFO $uri;
			fastcgi_param QUERY_STRING $query_string;
			fastcgi_param REQUEST_METHOD $request_method;
			fastcgi_param CONTENT_TYPE $content_type;
			fastcgi_param CONTENT_LENGTH $content_length;
			fastcgi_param GIT_PROTOCOL $http_git_protocol;
			fastcgi_param REMOTE_ADDR $remote_addr;
			fastcgi_param REMOTE_USER bench;
		}
	}
}
`

// StartNginx serves every repository under repos with nginx (master and 2
// workers) + fcgiwrap + git-http-backend, all in one group. fcgiwrap gets
// 64 children: its default of one would serve a herd one clone at a time.
// REMOTE_USER is set so git-http-backend accepts pushes.
func StartNginx(name, dir, repos string) *Server {
	EnsureTools(map[string]string{"nginx": "nginx", "fcgiwrap": "fcgiwrap"})
	if _, err := os.Stat("/usr/lib/git-core/git-http-backend"); err != nil {
		Fatalf("missing /usr/lib/git-core/git-http-backend (git's smart HTTP CGI program)")
	}
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o755); err != nil {
		Fatalf("%v", err)
	}
	sock := filepath.Join(dir, "fcgiwrap.sock")
	os.Remove(sock)
	port := FreePort()
	conf := strings.NewReplacer("{{DIR}}", dir, "{{PORT}}", port, "{{SOCK}}", sock, "{{REPOS}}", repos).Replace(nginxConf)
	if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(conf), 0o644); err != nil {
		Fatalf("%v", err)
	}
	g := NewGroup(name)
	logf, _ := os.Create(filepath.Join(dir, "stderr.log"))
	fcgi := g.Command("fcgiwrap", "-c", "64", "-s", "unix:"+sock)
	fcgi.Stdout, fcgi.Stderr = logf, logf
	if err := fcgi.Start(); err != nil {
		g.Close()
		Fatalf("%v", err)
	}
	stop := stopper(g, syscall.SIGTERM, logf, fcgi)
	waitFile(sock)
	ngx := g.Command("nginx", "-p", dir, "-c", filepath.Join(dir, "nginx.conf"), "-e", filepath.Join(dir, "error.log"))
	ngx.Stdout, ngx.Stderr = logf, logf
	if err := ngx.Start(); err != nil {
		stop()
		Fatalf("%v", err)
	}
	s := register(&Server{Port: port, Group: g, stop: func() {
		ngx.Process.Signal(syscall.SIGQUIT)
		ngx.Wait()
		stop()
	}})
	WaitPort(port)
	return s
}

const sshdConf = `Port {{PORT}}
ListenAddress 127.0.0.1
HostKey {{DIR}}/ssh_host_ed25519_key
PidFile {{DIR}}/sshd.pid
AuthorizedKeysFile {{DIR}}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxStartups 4000
MaxSessions 64
AcceptEnv GIT_PROTOCOL
LogLevel ERROR
`

// SSHDUser is the account sshd serves git as: uid 0 (so it reads and
// writes the repositories the other servers use, with no ownership
// checks in the way), an empty home and git-shell as its shell, as Git
// hosts run it. Logging in as root would run root's ~/.bashrc on every
// command (bash sources it for ssh commands), which costs the peer time
// no git host pays.
const SSHDUser = "gitbench"

// StartSSHD runs OpenSSH's sshd on loopback, accepting only authorizedKey
// for SSHDUser, with its own host key. Clients reach repositories by
// absolute path: ssh://gitbench@127.0.0.1:PORT/abs/path.git. MaxStartups
// is raised so a herd is not dropped by sshd's default 10:30:100.
func StartSSHD(name, dir, authorizedKey string) *Server {
	EnsureTools(map[string]string{"sshd": "openssh-server", "ssh": "openssh-client"})
	if exec.Command("id", SSHDUser).Run() != nil {
		home := "/var/lib/" + SSHDUser
		os.MkdirAll(home, 0o755)
		Run("useradd", "--non-unique", "--uid", "0", "--gid", "0", "--no-create-home", "--home-dir", home, "--shell", "/usr/bin/git-shell", SSHDUser)
		// "*": no password, but not locked ("!"), which sshd without PAM refuses.
		Run("usermod", "--password", "*", SSHDUser)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		Fatalf("%v", err)
	}
	os.MkdirAll("/run/sshd", 0o755) // sshd's privilege separation directory
	hostKey := filepath.Join(dir, "ssh_host_ed25519_key")
	if _, err := os.Stat(hostKey); err != nil {
		Run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", hostKey)
	}
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), []byte(authorizedKey), 0o600); err != nil {
		Fatalf("%v", err)
	}
	port := FreePort()
	conf := strings.NewReplacer("{{DIR}}", dir, "{{PORT}}", port).Replace(sshdConf)
	confPath := filepath.Join(dir, "sshd_config")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		Fatalf("%v", err)
	}
	sshd, err := exec.LookPath("sshd")
	if err != nil {
		Fatalf("%v", err)
	}
	g := NewGroup(name)
	logf, _ := os.Create(filepath.Join(dir, "sshd.log"))
	cmd := g.Command(sshd, "-D", "-e", "-f", confPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		g.Close()
		Fatalf("%v", err)
	}
	s := register(&Server{Port: port, Group: g, stop: stopper(g, syscall.SIGTERM, logf, cmd)})
	WaitPort(port)
	return s
}

// SSHCommand is a GIT_SSH_COMMAND for benchmarks: no config, no host key
// checks, one key, and the cipher OpenSSH clients choose by default unless
// cipher is set.
func SSHCommand(key, cipher string) string {
	c := fmt.Sprintf("ssh -F /dev/null -o IdentitiesOnly=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o BatchMode=yes -i %s", key)
	if cipher != "" {
		c += " -c " + cipher
	}
	return c
}
