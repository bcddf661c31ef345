package packcache

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// Environment the pipeline gives upload-pack, which passes it to the hook.
const (
	EnvSocket    = "PACKWIRE_PACK_SOCKET"
	EnvRequestID = "PACKWIRE_REQUEST_ID"
	EnvRepoPath  = "PACKWIRE_REPO_PATH"
)

// Frames from the server to the hook: a type byte, a 4-byte length, data.
const (
	frameData     = 'd' // pack-objects stdout
	frameExit     = 'x' // 1 byte exit status; the stream ends
	frameFallback = 'f' // run pack-objects yourself
	frameMessage  = 'm' // a line for the hook's stderr
)

// HookConfig is the uploadpack.packObjectsHook value that makes upload-pack
// call this binary (run through the shell: the path is quoted).
func HookConfig(executable string) string {
	return "uploadpack.packObjectsHook='" + strings.ReplaceAll(executable, "'", `'\''`) + "'"
}

// RunHook is the whole life of the hook process: upload-pack calls it as
// "HOOK git pack-objects ARGS" with pack-objects' input on stdin. It asks
// the server for the pack; if the server is unreachable or stands aside,
// it runs pack-objects itself, so a broken cache never breaks a fetch.
func RunHook(args []string) int {
	stdin, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "packwire hook: reading input: %v\n", err)
		return 1
	}
	if code, ok := askServer(args, stdin); ok {
		return code
	}
	return runDirect(args, stdin)
}

func askServer(args []string, stdin []byte) (int, bool) {
	sock := os.Getenv(EnvSocket)
	if sock == "" {
		return 0, false
	}
	conn, err := net.DialTimeout("unix", sock, 2*time.Second)
	if err != nil {
		return 0, false
	}
	defer conn.Close()
	req := Request{
		RequestID: os.Getenv(EnvRequestID),
		RepoPath:  os.Getenv(EnvRepoPath),
		Args:      args,
		Config:    os.Getenv("GIT_CONFIG_PARAMETERS"),
		Protocol:  os.Getenv("GIT_PROTOCOL"),
		StdinSize: len(stdin),
	}
	if req.RepoPath == "" {
		req.RepoPath, _ = os.Getwd()
	}
	header, _ := json.Marshal(req)
	w := bufio.NewWriter(conn)
	w.Write(header)
	w.WriteByte('\n')
	w.Write(stdin)
	if w.Flush() != nil {
		return 0, false
	}
	// Frames are up to 256 KiB: write each straight to upload-pack, through
	// one reused buffer, rather than copying every pack byte twice.
	r := bufio.NewReaderSize(conn, 64<<10)
	buf := make([]byte, 256<<10)
	wroteData := false
	for {
		kind, payload, err := readFrame(r, buf)
		if err != nil {
			if !wroteData {
				return 0, false // nothing sent yet: run it ourselves
			}
			fmt.Fprintf(os.Stderr, "packwire hook: pack stream broken: %v\n", err)
			return 1, true
		}
		switch kind {
		case frameData:
			wroteData = true
			if _, err := os.Stdout.Write(payload); err != nil {
				return 1, true // upload-pack went away
			}
		case frameMessage:
			os.Stderr.Write(payload)
		case frameFallback:
			return 0, false
		case frameExit:
			if len(payload) == 1 {
				return int(payload[0]), true
			}
			return 1, true
		}
	}
}

func runDirect(args []string, stdin []byte) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "packwire hook: no command")
		return 1
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		fmt.Fprintf(os.Stderr, "packwire hook: %v\n", err)
		return 1
	}
	return 0
}

// readFrame reads one frame into buf (grown if a frame needs more) and
// returns its payload, valid until the next call.
func readFrame(r *bufio.Reader, buf []byte) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := int(binary.BigEndian.Uint32(hdr[1:]))
	if n > 1<<20 {
		return 0, nil, errors.New("frame too large")
	}
	if n > len(buf) {
		buf = make([]byte, n)
	}
	_, err := io.ReadFull(r, buf[:n])
	return hdr[0], buf[:n], err
}

// frameWriter frames everything written to it as data.
type frameWriter struct {
	w   io.Writer
	err error
}

// frame sends header and payload in one writev, without copying the payload.
func (f *frameWriter) frame(kind byte, p []byte) error {
	if f.err != nil {
		return f.err
	}
	var hdr [5]byte
	hdr[0] = kind
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(p)))
	bufs := net.Buffers{hdr[:], p}
	_, f.err = bufs.WriteTo(f.w)
	return f.err
}

func (f *frameWriter) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		n := min(len(p), 256<<10)
		if err := f.frame(frameData, p[:n]); err != nil {
			return 0, err
		}
		p = p[n:]
	}
	return total, nil
}

// MaxHookInput bounds the pack-objects input a hook may send (wants, haves,
// shallow lines): a 100,000-ref fetch is far below it.
const MaxHookInput = 64 << 20

// ServeHooks accepts hook connections on l until it is closed.
func (c *Cache) ServeHooks(l net.Listener) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := l.Accept()
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.handleHook(conn)
		}()
	}
}

func (c *Cache) handleHook(conn net.Conn) {
	defer conn.Close()
	r := bufio.NewReader(conn)
	fw := &frameWriter{w: conn}
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	line, err := r.ReadBytes('\n')
	var req Request
	if err != nil || json.Unmarshal(line, &req) != nil || req.StdinSize < 0 || req.StdinSize > MaxHookInput {
		fw.frame(frameFallback, nil)
		return
	}
	stdin := make([]byte, req.StdinSize)
	if _, err := io.ReadFull(r, stdin); err != nil {
		fw.frame(frameFallback, nil)
		return
	}
	conn.SetReadDeadline(time.Time{})
	// The hook closing its end (its upload-pack was killed) cancels this reader.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		io.Copy(io.Discard, r)
		cancel()
	}()
	_, err = c.Serve(ctx, req, stdin, fw)
	switch {
	case errors.Is(err, ErrStandAside):
		fw.frame(frameFallback, nil)
	case err != nil:
		fw.frame(frameMessage, []byte("packwire: "+err.Error()+"\n"))
		fw.frame(frameExit, []byte{1})
	default:
		fw.frame(frameExit, []byte{0})
	}
}
