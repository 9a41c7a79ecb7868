package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// pingPongEnv makes a tcbench process the far side of a ping-pong
// reference: its value is "unix:PATH" or "tcp:ADDR" to listen on. See
// ServePingPong.
const pingPongEnv = "TCBENCH_PINGPONG_SERVER"

// ServePingPong is the far side of a raw ping-pong between two processes:
// when this process was started as one (pingPongEnv), it listens, echoes
// every message of one connection back, and exits when the connection
// closes; it returns false otherwise and the caller goes on as tcbench.
// cmd/tcbench calls it first thing.
func ServePingPong() bool {
	spec := os.Getenv(pingPongEnv)
	if spec == "" {
		return false
	}
	network, addr, _ := strings.Cut(spec, ":")
	ln, err := net.Listen(network, addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pingpong:", err)
		os.Exit(2)
	}
	fmt.Println(ln.Addr().String()) // where the parent dials
	c, err := ln.Accept()
	if err != nil {
		os.Exit(2)
	}
	ln.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	// Echo: whatever comes goes back, until the parent hangs up.
	buf := make([]byte, 1<<20)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if _, werr := c.Write(buf[:n]); werr != nil {
				os.Exit(0)
			}
		}
		if err != nil {
			os.Exit(0)
		}
	}
}

// PingPong is a raw socket ping-pong between this process and a child
// echoing process: messages of size bytes there and back, one at a time,
// for d. It returns round trips per second and the round trip latency
// histogram. network is "unix" or "tcp" (loopback).
func PingPong(ctx context.Context, network string, size uint64, d time.Duration) (float64, *Histogram, error) {
	c, _, stop, err := dialPingPong(ctx, network)
	if err != nil {
		return 0, nil, err
	}
	defer stop()
	msg := make([]byte, size)
	back := make([]byte, size)
	h := &Histogram{}
	start := time.Now()
	end := start.Add(d)
	trips := 0
	for t0 := start; t0.Before(end); trips++ {
		if ctx.Err() != nil {
			return 0, nil, ctx.Err()
		}
		if _, err := c.Write(msg); err != nil {
			return 0, nil, err
		}
		if _, err := io.ReadFull(c, back); err != nil {
			return 0, nil, err
		}
		t1 := time.Now()
		h.Record(uint64(t1.Sub(t0)))
		t0 = t1
	}
	return float64(trips) / time.Since(start).Seconds(), h, nil
}

// dialPingPong starts the ping-pong server (this executable again, with
// pingPongEnv set) on network ("unix" or "tcp", loopback) and dials it:
// the connection, the server's process, and stop, which closes the
// connection and ends the server.
func dialPingPong(ctx context.Context, network string) (net.Conn, *os.Process, func(), error) {
	self, err := os.Executable()
	if err != nil {
		return nil, nil, nil, err
	}
	spec, dir := "tcp:127.0.0.1:0", ""
	if network == "unix" {
		if dir, err = os.MkdirTemp("", "tcbench-pingpong-"); err != nil {
			return nil, nil, nil, err
		}
		spec = "unix:" + filepath.Join(dir, "pp.sock")
	}
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), pingPongEnv+"="+spec)
	cmd.Stderr = os.Stderr
	var c net.Conn
	stop := func() {
		if c != nil {
			c.Close()
		}
		if cmd.Process != nil {
			cmd.Process.Kill() //nolint:errcheck // it may have exited as the connection closed
			cmd.Wait()         //nolint:errcheck
		}
		if dir != "" {
			os.RemoveAll(dir)
		}
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		stop()
		return nil, nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		stop()
		return nil, nil, nil, fmt.Errorf("%w: ping-pong server: %w", ErrToolMissing, err)
	}
	var line [256]byte
	n, err := out.Read(line[:])
	if err != nil || n == 0 {
		stop()
		return nil, nil, nil, fmt.Errorf("%w: ping-pong server did not start: %v", ErrToolMissing, err)
	}
	if c, err = net.Dial(network, strings.TrimSpace(string(line[:n]))); err != nil {
		stop()
		return nil, nil, nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	return c, cmd.Process, stop, nil
}
