package ssh

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestTCPKeepAlive: the server's side of an SSH connection has TCP keepalive
// on with tcpKeepAlive's timing, so the kernel finds a vanished client even
// while a command blocks the connection.
func TestTCPKeepAlive(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	client := h.dial(h.signer(h.aliceKey))
	_, clientPort, _ := net.SplitHostPort(client.LocalAddr().String())
	fd := serverSocket(t, h.port, clientPort)
	for _, opt := range []struct {
		name       string
		level, opt int
		want       int
	}{
		{"SO_KEEPALIVE", unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
		{"TCP_KEEPIDLE", unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, int(tcpKeepAlive.Idle.Seconds())},
		{"TCP_KEEPINTVL", unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, int(tcpKeepAlive.Interval.Seconds())},
		{"TCP_KEEPCNT", unix.IPPROTO_TCP, unix.TCP_KEEPCNT, tcpKeepAlive.Count},
	} {
		got, err := unix.GetsockoptInt(fd, opt.level, opt.opt)
		if err != nil {
			t.Fatalf("%s: %v", opt.name, err)
		}
		if got != opt.want {
			t.Errorf("%s is %d on the server's socket, want %d", opt.name, got, opt.want)
		}
	}
	if tcpKeepAlive.Idle.Seconds() != 30 || tcpKeepAlive.Interval.Seconds() != 15 || tcpKeepAlive.Count != 4 {
		t.Errorf("tcpKeepAlive is %+v, want 30s idle, 15s interval, 4 probes", tcpKeepAlive)
	}
}

// serverSocket finds, among this process's open files, the server's socket
// of the loopback connection between serverPort and clientPort.
func serverSocket(t *testing.T, serverPort, clientPort string) int {
	t.Helper()
	hexPort := func(port string) string {
		n, _ := strconv.Atoi(port)
		return fmt.Sprintf("%04X", n)
	}
	table, err := os.ReadFile("/proc/self/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	inode := ""
	for _, line := range strings.Split(string(table), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 9 && strings.HasSuffix(f[1], ":"+hexPort(serverPort)) && strings.HasSuffix(f[2], ":"+hexPort(clientPort)) {
			inode = f[9]
		}
	}
	if inode == "" {
		t.Fatalf("no server socket for port %s <- %s in /proc/self/net/tcp", serverPort, clientPort)
	}
	fds, _ := os.ReadDir("/proc/self/fd")
	for _, e := range fds {
		if target, _ := os.Readlink("/proc/self/fd/" + e.Name()); target == "socket:["+inode+"]" {
			fd, _ := strconv.Atoi(e.Name())
			return fd
		}
	}
	t.Fatalf("socket inode %s is not among this process's files", inode)
	return -1
}
