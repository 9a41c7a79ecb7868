package client

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/tensorcast/tensorcast/control"
)

// TestReconnectKeepsThePool: with Options.Reconnect, the call after the one
// that finds the connection broken dials again; the mapping stays when the
// daemon serves the same pool, and a daemon with another pool is refused.
func TestReconnectKeepsThePool(t *testing.T) {
	d := startDaemon(t)
	c, err := Dial(d.sock, Options{Name: "reconnect", Reconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mem := c.PoolBytes()

	// The same pool behind a new server on the same socket: a restart that
	// kept it.
	d.srv.Close()
	srv, err := control.NewServer(control.Config{Socket: d.sock, DaemonID: "d-1", Version: "v-test"},
		control.Deps{Engine: d.eng, Pool: d.pool, Registry: d.reg}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	if err := c.Ping(nil); err == nil {
		t.Fatal("a ping over the connection to the server that went succeeded")
	}
	if err := c.Ping(nil); err != nil {
		t.Fatalf("no reconnect: %v", err)
	}
	if &c.PoolBytes()[0] != &mem[0] {
		t.Fatal("the pool was mapped again")
	}
	if _, err := c.AllocBlocks(nil, 1, 4096); err != nil {
		t.Fatalf("a call after reconnecting: %v", err)
	}

	// Another pool on the socket: the client refuses to go on with a
	// mapping that is not the daemon's pool.
	srv.Close()
	startDaemon(t, func(cfg *control.Config) { cfg.Socket = d.sock })
	if err := c.Ping(nil); err == nil {
		t.Fatal("a ping over the connection to the server that went succeeded")
	}
	if err := c.Ping(nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("reconnecting to a daemon with another pool: %v, want ErrClosed", err)
	}
}
