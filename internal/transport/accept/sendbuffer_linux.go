package accept

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// sendBufferLimits reads net.core.wmem_max (the most SO_SNDBUF may ask
// for) and tcp_wmem's maximum (the most autotuning grows a buffer to).
func sendBufferLimits() (max, autotuned int, err error) {
	b, err := os.ReadFile("/proc/sys/net/core/wmem_max")
	if err != nil {
		return 0, 0, err
	}
	if max, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
		return 0, 0, err
	}
	b, err = os.ReadFile("/proc/sys/net/ipv4/tcp_wmem")
	if err != nil {
		return 0, 0, err
	}
	f := strings.Fields(string(b))
	if len(f) != 3 {
		return 0, 0, fmt.Errorf("tcp_wmem: %q", b)
	}
	autotuned, err = strconv.Atoi(f[2])
	return max, autotuned, err
}
