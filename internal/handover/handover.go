// Package handover passes listening sockets from one packwire process to
// the next, so that a restart or an upgrade refuses no connection: the
// sockets stay open in the kernel the whole time, and connections that
// arrive while the new process starts wait in their backlog.
//
// Two senders use the same receiving end (Inherited):
//   - systemd socket activation (sd_listen_fds(3)): LISTEN_PID, LISTEN_FDS
//     and LISTEN_FDNAMES, descriptors from 3 on, named by the socket
//     unit's FileDescriptorName=;
//   - packwire's own re-exec (Exec): EnvNames lists the names of the
//     descriptors from 3 on, and EnvReady the descriptor of a pipe on
//     which the new process says it is ready (Ready).
package handover

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

const (
	// EnvNames is the colon-separated names of the inherited listeners,
	// descriptors 3, 4, ... in order, set by Exec.
	EnvNames = "PACKWIRE_LISTEN_FDNAMES"
	// EnvReady is the descriptor the new process writes one byte to once
	// it serves (Ready), set by Exec.
	EnvReady = "PACKWIRE_READY_FD"
)

// firstFD is where inherited descriptors start (after stdin, stdout, stderr).
const firstFD = 3

// Inherited returns the listeners this process was handed, by name, and
// who handed them ("systemd", "packwire" or "" for none). It reads the
// environment once and clears it, so that git and the other children do
// not believe the sockets are theirs. A systemd descriptor without a name
// of its own (FileDescriptorName=) is named "fdN"; the caller matches
// those by address.
func Inherited() (map[string]net.Listener, string, error) {
	if names, ok := os.LookupEnv(EnvNames); ok {
		os.Unsetenv(EnvNames)
		ls, err := listeners(strings.Split(names, ":"))
		return ls, "packwire", err
	}
	pid, fds := os.Getenv("LISTEN_PID"), os.Getenv("LISTEN_FDS")
	names := os.Getenv("LISTEN_FDNAMES")
	for _, k := range []string{"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} {
		os.Unsetenv(k)
	}
	if fds == "" || pid != strconv.Itoa(os.Getpid()) {
		return nil, "", nil // not for this process (sd_listen_fds does the same)
	}
	n, err := strconv.Atoi(fds)
	if err != nil || n < 0 {
		return nil, "", fmt.Errorf("LISTEN_FDS=%q: not a count", fds)
	}
	list := make([]string, n)
	given := strings.Split(names, ":")
	count := map[string]int{}
	for _, name := range given {
		count[name]++
	}
	for i := range list {
		// A name several sockets share (systemd's default is the socket
		// unit's: "packwire.socket" for each ListenStream=) names none.
		if i < len(given) && given[i] != "" && given[i] != "unknown" && count[given[i]] == 1 {
			list[i] = given[i]
		} else {
			list[i] = "fd" + strconv.Itoa(firstFD+i)
		}
	}
	ls, err := listeners(list)
	return ls, "systemd", err
}

func listeners(names []string) (map[string]net.Listener, error) {
	out := map[string]net.Listener{}
	var errs []error
	for i, name := range names {
		fd := firstFD + i
		f := os.NewFile(uintptr(fd), name)
		l, err := net.FileListener(f)
		f.Close() // FileListener holds its own duplicate (close-on-exec: git does not inherit it)
		if err != nil {
			errs = append(errs, fmt.Errorf("inherited descriptor %d (%s): %w", fd, name, err))
			continue
		}
		if _, dup := out[name]; dup {
			l.Close()
			errs = append(errs, fmt.Errorf("inherited descriptor %d: a second listener named %q", fd, name))
			continue
		}
		out[name] = l
	}
	if len(errs) > 0 {
		for _, l := range out {
			l.Close()
		}
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// File is a duplicate of a listener's socket to hand to a new process.
func File(l net.Listener) (*os.File, error) {
	fl, ok := l.(interface{ File() (*os.File, error) })
	if !ok {
		return nil, fmt.Errorf("listener on %s cannot be handed over (%T)", l.Addr(), l)
	}
	return fl.File()
}

// Ready tells whoever started this process that it serves: the packwire
// process handing over (EnvReady), and systemd (NOTIFY_SOCKET, with
// MAINPID: after a re-exec the new process is the service's main one).
func Ready() error {
	var errs []error
	if v, ok := os.LookupEnv(EnvReady); ok {
		os.Unsetenv(EnvReady)
		fd, err := strconv.Atoi(v)
		if err == nil {
			f := os.NewFile(uintptr(fd), "ready")
			_, err = f.Write([]byte{'1'})
			f.Close()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%s: %w", EnvReady, v, err))
		}
	}
	if err := Notify(fmt.Sprintf("MAINPID=%d\nREADY=1", os.Getpid())); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Notify sends state to systemd's NOTIFY_SOCKET (sd_notify(3)); without
// one it does nothing.
func Notify(state string) error {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return nil
	}
	if path[0] == '@' {
		path = "\x00" + path[1:] // an abstract socket
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("systemd notify: %w", err)
	}
	defer c.Close()
	_, err = c.Write([]byte(state))
	return err
}

// Exec starts exe with args as the next process, handing it files (the
// listeners, by name, in order), with the same stdout and stderr, and
// waits until it says it is ready (Ready), it exits, or timeout passes.
// On any failure the new process is killed and the caller keeps serving.
func Exec(exe string, args []string, names []string, files []*os.File, timeout time.Duration) (*os.Process, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := exec.Command(exe, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
	cmd.ExtraFiles = append(append([]*os.File{}, files...), w)
	cmd.Env = append(withoutHandover(os.Environ()),
		EnvNames+"="+strings.Join(names, ":"),
		EnvReady+"="+strconv.Itoa(firstFD+len(files)))
	err = cmd.Start()
	w.Close() // ours: only the child's copy is left to write or close
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", exe, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	ready := make(chan error, 1)
	go func() {
		var b [1]byte
		_, err := io.ReadFull(r, b[:])
		ready <- err
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case err := <-ready:
		if err == nil {
			// The child outlives this process; nobody here waits for it
			// any more (the goroutine above does, harmlessly).
			return cmd.Process, nil
		}
		cmd.Process.Kill()
		<-exited
		return nil, fmt.Errorf("the new process (pid %d) exited before it was ready", cmd.Process.Pid)
	case err := <-exited:
		return nil, fmt.Errorf("the new process (pid %d) exited before it was ready: %v", cmd.Process.Pid, err)
	case <-timer.C:
		cmd.Process.Kill()
		<-exited
		return nil, fmt.Errorf("the new process (pid %d) was not ready within %s: killed", cmd.Process.Pid, timeout)
	}
}

func withoutHandover(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case EnvNames, EnvReady, "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES":
			continue
		}
		out = append(out, kv)
	}
	return out
}
