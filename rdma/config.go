package rdma

// Config: what tunes a device and its transports, with the defaults and
// the checks Open and NewTransport apply.

import (
	"fmt"
	"time"
)

// Config tunes a device and the transports opened on it. The zero value
// means the defaults.
type Config struct {
	// Device is the RDMA device name ("" = the first one with an active port).
	Device string
	// Port is the device port (0 = 1).
	Port int
	// GID overrides the automatic choice of the RoCE v2 GID of Netdev's
	// address: a GID table index ("3") or an address ("10.0.2.15",
	// "::ffff:10.0.2.15"). "" = automatic.
	GID string
	// Netdev is the network device whose address the GID must carry
	// ("" = whichever the GID table names).
	Netdev string
	// QPs is how many RC queue pairs a transport spreads work over (2).
	QPs int
	// SendDepth is each queue pair's send queue size, a power of two (256).
	SendDepth int
	// SignalEvery asks for a completion on every nth work request of a
	// posted list, and always on its last (16).
	SignalEvery int
	// PollBatch is how many completions one ibv_poll_cq call takes (32).
	PollBatch int
	// PollSpin is how long a queue pair's goroutine keeps polling its
	// empty completion queue before it arms the channel and sleeps (50 µs;
	// negative: never spin); a reactor's Home has its own (NewHomes). Spinning saves the interrupt and wake-up per completion at
	// light load, at the price of that much CPU after each burst.
	PollSpin time.Duration
	// ChunkSize is what one MR covers when a segment is registered, a power
	// of two (1 GiB); RegisterWorkers chunks are registered at once (4).
	ChunkSize       uint64
	RegisterWorkers int
	// MaxMessage caps one work request's length (1 GiB).
	MaxMessage uint64
	// SubmitWait bounds how long Submit waits for send-queue room (1 s).
	SubmitWait time.Duration
	// ConnectTimeout bounds bringing one queue pair up, including the probe
	// that checks the peer answers (5 s).
	ConnectTimeout time.Duration
	// Timeout and RetryCount are the RC transport's ack timeout exponent
	// (4.096 µs × 2^Timeout) and retry count (14 and 7).
	Timeout    uint8
	RetryCount uint8
	// Homes are the reactor workers that submit to the transports and
	// reap their completions themselves (nil: none; every completion is
	// reaped by the transport's own goroutines). See "Who reaps" in the
	// package doc.
	Homes *Homes
}

// DefaultConfig is the configuration the zero values of Config stand for.
func DefaultConfig() Config {
	return Config{
		Port: 1, QPs: 2, SendDepth: 256, SignalEvery: 16, PollBatch: 32, PollSpin: 50 * time.Microsecond,
		ChunkSize: DefaultChunkSize, RegisterWorkers: 4, MaxMessage: 1 << 30,
		SubmitWait: time.Second, ConnectTimeout: 5 * time.Second, Timeout: 14, RetryCount: 7,
	}
}

// withDefaults fills zero fields from DefaultConfig and checks the rest.
func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	if c.Port == 0 {
		c.Port = d.Port
	}
	if c.QPs == 0 {
		c.QPs = d.QPs
	}
	if c.SendDepth == 0 {
		c.SendDepth = d.SendDepth
	}
	if c.SignalEvery == 0 {
		c.SignalEvery = d.SignalEvery
	}
	if c.PollBatch == 0 {
		c.PollBatch = d.PollBatch
	}
	if c.PollSpin == 0 {
		c.PollSpin = d.PollSpin
	}
	if c.ChunkSize == 0 {
		c.ChunkSize = d.ChunkSize
	}
	if c.RegisterWorkers == 0 {
		c.RegisterWorkers = d.RegisterWorkers
	}
	if c.MaxMessage == 0 {
		c.MaxMessage = d.MaxMessage
	}
	if c.SubmitWait == 0 {
		c.SubmitWait = d.SubmitWait
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = d.ConnectTimeout
	}
	if c.Timeout == 0 {
		c.Timeout = d.Timeout
	}
	if c.RetryCount == 0 {
		c.RetryCount = d.RetryCount
	}
	switch {
	case c.QPs < 1 || c.QPs > 256:
		return c, fmt.Errorf("rdma: config QPs %d: want 1..256", c.QPs)
	case c.SendDepth < 4 || c.SendDepth > 1<<15 || c.SendDepth&(c.SendDepth-1) != 0:
		return c, fmt.Errorf("rdma: config SendDepth %d: want a power of two in 4..32768", c.SendDepth)
	case c.ChunkSize&(c.ChunkSize-1) != 0 || c.ChunkSize < minChunkSize:
		return c, fmt.Errorf("rdma: config ChunkSize %d: want a power of two >= %d", c.ChunkSize, minChunkSize)
	case c.MaxMessage > 1<<31:
		return c, fmt.Errorf("rdma: config MaxMessage %d: want <= 2 GiB", c.MaxMessage)
	case c.Timeout > 31 || c.RetryCount > 7:
		return c, fmt.Errorf("rdma: config Timeout %d / RetryCount %d: want <= 31 / <= 7", c.Timeout, c.RetryCount)
	}
	return c, nil
}
