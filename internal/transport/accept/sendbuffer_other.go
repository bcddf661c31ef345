//go:build !linux

package accept

// sendBufferLimits: elsewhere GrowSendBuffer leaves buffers as they are.
func sendBufferLimits() (max, autotuned int, err error) { return 0, 0, errNoLimits }
