package tcp

// Config: what configures a Node, its defaults and checks (setDefaults),
// and the keys derived from the cluster key file.

import (
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tensorcast/tensorcast/directory"
)

// MaxNotify is the largest notification payload a WRITE may carry.
const MaxNotify = 4096

// Config configures a Node. Zero values take the documented defaults.
type Config struct {
	// DaemonID names this daemon among its peers (1..64 bytes). Required.
	DaemonID string
	// Listen is the host:port of the peer listener ("127.0.0.1:0" picks a
	// free port). Required.
	Listen string
	// Listener, when set, is a listening TCP socket to serve on instead of
	// binding Listen: the one an earlier daemon handed over, whose backlog
	// held the connections peers made in between. NewNode owns it from the
	// call on (it closes it when it fails). Listen then only names it in
	// errors and logs.
	Listener *net.TCPListener
	// Advertise is the address peers are told to dial; default: the bound
	// listen address.
	Advertise string
	// ClusterKeyFile holds the shared cluster key. Required; refused when
	// empty or readable by group or others.
	ClusterKeyFile string
	// ConnsPerPeer is how many connections carry requests to each peer
	// (default 4).
	ConnsPerPeer int
	// SliceSize is the largest payload of one frame; bigger requests are
	// cut into slices striped across connections (default 1 MiB).
	SliceSize int
	// MaxFrame is the largest payload a peer's frame may claim (default and
	// minimum: SliceSize).
	MaxFrame int
	// MaxInflightBytes bounds the bytes of requests in flight on one
	// connection, data exchanges' payloads included (default 4 ×
	// SliceSize, minimum SliceSize).
	MaxInflightBytes int64
	// MaxPeerInflightBytes bounds them per peer (default ConnsPerPeer ×
	// MaxInflightBytes).
	MaxPeerInflightBytes int64
	// HandshakeTimeout bounds dialing plus the handshake of one connection
	// (default 5s).
	HandshakeTimeout time.Duration
	// RequestTimeout bounds one request's round trip and a task's wait in
	// its peer's queue (default 30s). A connection with a request older
	// than this is dropped and its requests fail.
	RequestTimeout time.Duration
	// MaxQueued bounds the tasks that may wait for one peer's session or
	// flow-control room (default 16384); past it a task fails at once with
	// ErrBacklog.
	MaxQueued int
	// TokenTTL is how long capability tokens this node issues stay valid
	// (default 10 minutes).
	TokenTTL time.Duration
	// tokenClock, when set (by tests), is the clock tokens are issued,
	// checked and renewed by; nil is the wall clock.
	tokenClock func() time.Time
	// Epoch identifies this run of the daemon. Zero (the default) draws a
	// random one, new at every start.
	Epoch uint64
	// Blob is opaque data sent to peers in the handshake (RDMA connection
	// data); at most 1024 bytes.
	Blob []byte
	// Peers are the configured peers, used when Directory is nil.
	Peers []directory.Peer
	// Directory finds peers; default: an embedded directory of Peers.
	Directory directory.Directory
}

func (c *Config) setDefaults() error {
	bad := func(key string, v any, why string) error {
		return fmt.Errorf("%w: %s = %v: %s", ErrConfig, key, v, why)
	}
	if c.DaemonID == "" || len(c.DaemonID) > maxIDLen {
		return bad("DaemonID", strconv.Quote(c.DaemonID), "must be 1..64 bytes")
	}
	if c.Listen == "" {
		return bad("Listen", `""`, "required")
	}
	if c.ConnsPerPeer == 0 {
		c.ConnsPerPeer = 4
	}
	if c.ConnsPerPeer < 1 || c.ConnsPerPeer > 64 {
		return bad("ConnsPerPeer", c.ConnsPerPeer, "must be 1..64")
	}
	if c.SliceSize == 0 {
		c.SliceSize = 1 << 20
	}
	if c.SliceSize < 4096 || c.SliceSize > 64<<20 {
		return bad("SliceSize", c.SliceSize, "must be 4 KiB..64 MiB")
	}
	if c.MaxFrame == 0 {
		c.MaxFrame = c.SliceSize
	}
	if c.MaxFrame < c.SliceSize || c.MaxFrame > 64<<20 {
		return bad("MaxFrame", c.MaxFrame, "must be SliceSize..64 MiB")
	}
	if c.MaxInflightBytes == 0 {
		c.MaxInflightBytes = 4 * int64(c.SliceSize)
	}
	if c.MaxInflightBytes < int64(c.SliceSize) {
		return bad("MaxInflightBytes", c.MaxInflightBytes, "must be at least SliceSize")
	}
	if c.MaxPeerInflightBytes == 0 {
		c.MaxPeerInflightBytes = int64(c.ConnsPerPeer) * c.MaxInflightBytes
	}
	if c.MaxPeerInflightBytes < int64(c.SliceSize) {
		return bad("MaxPeerInflightBytes", c.MaxPeerInflightBytes, "must be at least SliceSize")
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = 5 * time.Second
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = 30 * time.Second
	}
	if c.TokenTTL == 0 {
		c.TokenTTL = 10 * time.Minute
	}
	if c.MaxQueued == 0 {
		c.MaxQueued = 16384
	}
	if c.MaxQueued < 1 || c.MaxQueued > 1<<20 {
		return bad("MaxQueued", c.MaxQueued, "must be 1..1048576")
	}
	if c.HandshakeTimeout < 0 || c.RequestTimeout < 0 || c.TokenTTL < 0 {
		return bad("timeouts", "negative", "must be positive")
	}
	if len(c.Blob) > maxBlobLen {
		return bad("Blob", len(c.Blob), "must be at most 1024 bytes")
	}
	return nil
}

// readClusterKey loads the cluster key, refusing a file that group or
// others can read or write, or an empty one.
func readClusterKey(path string) ([]byte, error) {
	if path == "" {
		return nil, fmt.Errorf("%w: ClusterKeyFile not set", ErrKeyFile)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKeyFile, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKeyFile, err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%w: %s has mode %v; group/other access must be off (chmod 600)", ErrKeyFile, path, st.Mode().Perm())
	}
	buf := make([]byte, 4096)
	k, err := f.Read(buf)
	if err != nil && k == 0 {
		return nil, fmt.Errorf("%w: %s is empty", ErrKeyFile, path)
	}
	key := []byte(strings.TrimSpace(string(buf[:k])))
	if len(key) == 0 {
		return nil, fmt.Errorf("%w: %s is empty", ErrKeyFile, path)
	}
	return key, nil
}

// ClusterSubkey is the key labelled label derived from the cluster key in
// path, for the other parts of the daemon that sign with the cluster key
// (retention handles): each purpose has its own key, none is the cluster
// key itself.
func ClusterSubkey(path, label string) ([]byte, error) {
	key, err := readClusterKey(path)
	if err != nil {
		return nil, err
	}
	return deriveKey(key, label), nil
}

func deriveKey(master []byte, label string) []byte {
	m := hmac.New(sha256.New, master)
	m.Write([]byte(label))
	return m.Sum(nil)
}
