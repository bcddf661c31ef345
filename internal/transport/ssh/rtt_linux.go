package ssh

import (
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// handshakeRTT is the kernel's estimate of nc's round trip, measured on the
// TCP handshake; ok is false when there is none.
func handshakeRTT(nc net.Conn) (rtt time.Duration, ok bool) {
	tc, isTCP := nc.(*net.TCPConn)
	if !isTCP {
		return 0, false
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var info *unix.TCPInfo
	raw.Control(func(fd uintptr) {
		info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	})
	if err != nil || info == nil || info.Rtt == 0 {
		return 0, false
	}
	return time.Duration(info.Rtt) * time.Microsecond, true
}
