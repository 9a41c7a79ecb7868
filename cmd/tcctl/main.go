// Command tcctl is the admin and client CLI of tensorcastd.
//
//	tcctl [--socket PATH] info
//	tcctl [--socket PATH] stats [--json]
//	tcctl top [--metrics HOST:PORT] [--interval D] [-n FRAMES]
//	tcctl config check FILE
//	tcctl [--socket PATH] ping [-n COUNT] [-size BYTES] [--queue] [--own]
//	tcctl [--socket PATH] peers
//	tcctl [--socket PATH] segments [--remote]
//	tcctl [--socket PATH] rdma
//	tcctl [--socket PATH] directory
//	tcctl [--socket PATH] put [--durable] KEY FILE
//	tcctl [--socket PATH] get KEY [FILE]
//	tcctl [--socket PATH] rm KEY...
//	tcctl [--socket PATH] ls [--prefix P]
//	tcctl [--socket PATH] stat KEY
//	tcctl [--socket PATH] handle issue [--ttl D] KEY... | renew [--ttl D] TOKEN | release TOKEN
//	tcctl [--socket PATH] lease create [--ttl D] OP KEY... | release OP
//	tcctl [--socket PATH] mode [show | set MODE]
//
// The socket defaults to $TENSORCAST_SOCKET, else
// /run/tensorcast/tensorcastd.sock.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/wire"
)

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

const usage = `usage: tcctl [--socket PATH] COMMAND [ARGS]

commands:
  info                    daemon id, version, limits and pool
  stats [--json]          pool, engine and connection counters
  top [--metrics HOST:PORT] [--interval D] [-n FRAMES]
                          live view from the metrics endpoint: IOPS,
                          throughput and latency percentiles (of sampled
                          calls) per transport, peer and io_uring ring
                          (kernel view)
  config check FILE       validate a tensorcastd config file without
                          starting anything: each error with key and line
  ping [-n COUNT] [-size BYTES] [--queue] [--own]
                          round trips to the daemon, with latency stats
                          (--queue: through a shared-memory queue; --own:
                          fail unless the daemon is in this pid namespace,
                          for a pod's probe of its own daemon)
  peers                   peer daemons: address, epoch, connection, bytes, errors
  segments [--remote]     segments exported to peers, with the tenants each
                          grants (--remote: the remote segments opened
                          through this daemon instead)
  export [--grant TENANT]... NAME FILE
                          export a copy of FILE read-only to the peer
                          daemons' clients of this user's tenant as NAME and,
                          as DAEMON/TENANT/NAME, to those of each tenant
                          granted; held until interrupted or stdin ends
  rdma                    RDMA: device, port and GID in use, the pool's
                          registration, each peer's transport and link; or
                          why RDMA is off or unavailable
  directory               the peer directory: backend and state, the cache's
                          age, hit and fallback rates, each member's epoch
                          and lease time left (embedded: the configured peers)
  cluster                 the store across hosts: members up, the shards this
                          daemon is home of and their keys, claims held,
                          remote gets (hits, misses, failures, bytes), home
                          lookups, re-announcements; the homes of the shards
                          with their generations, the read claims this
                          daemon has outstanding by holder
  cluster shards [--all]  each shard this daemon is home of (--all: every
                          shard): its home and generation, the member
                          rendezvous names, its keys indexed here
  cluster locate KEY      where KEY lives: its shard, the shard's home and
                          generation, the holders its home names
  put [--durable] KEY FILE
                          store FILE (- is stdin) under KEY in the KV block
                          store; --durable: on L2 before it answers
  get KEY [FILE]          write KEY's value to FILE (default stdout)
  rm KEY...               remove keys (an absent key is a success)
  ls [--prefix P]         stored keys: size, tier, pins
  stat KEY                one key: size, tier, pins, writeback state
  handle issue [--ttl D] KEY...
                          a retention handle: keeps the keys from eviction
                          until released or expired (default 1m); prints its
                          token (hex), id and expiry
  handle renew [--ttl D] TOKEN
                          extend a handle at its issuer; prints the new token
  handle release TOKEN    give a handle's keys back, at its issuer
  lease create [--ttl D] OP KEY...
                          a placement lease: pin the keys for the TTL under
                          operation id OP; a retry with the same OP and keys
                          joins the first lease, with other keys it is refused
  lease release OP        give a lease's keys back
  mode [show | set MODE]  the admission budgets for remote work: local-first,
                          budgeted-hybrid or global-governed (set: root or
                          the daemon's user)
                          The store, handle, lease and mode commands exit 0
                          only on success and print the status code's name
                          otherwise.

The socket is --socket, else $TENSORCAST_SOCKET, else ` + client.DefaultSocket + `.
`

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tcctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	sock := client.DefaultSocket
	if s := getenv("TENSORCAST_SOCKET"); s != "" {
		sock = s
	}
	fs.StringVar(&sock, "socket", sock, "daemon socket path")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	cmd, rest := fs.Arg(0), fs.Args()[1:]
	var err error
	switch cmd {
	case "info":
		err = info(sock, stdout)
	case "stats":
		err = stats(sock, rest, stdout, stderr)
	case "top":
		err = top(rest, getenv, stdout, stderr)
	case "config":
		err = configCmd(rest, stdout, stderr)
	case "ping":
		err = ping(sock, rest, stdout, stderr)
	case "peers":
		err = peers(sock, rest, stdout)
	case "segments":
		err = segments(sock, rest, stdout, stderr)
	case "export":
		err = exportCmd(sock, rest, stdout, stderr)
	case "rdma":
		err = rdmaCmd(sock, rest, stdout)
	case "directory":
		err = directoryCmd(sock, rest, stdout)
	case "cluster":
		err = clusterCmd(sock, rest, stdout)
	case "put":
		err = putCmd(sock, rest, stderr)
	case "get":
		err = getCmd(sock, rest, stdout, stderr)
	case "rm":
		err = rmCmd(sock, rest, stderr)
	case "ls":
		err = lsCmd(sock, rest, stdout, stderr)
	case "stat":
		err = statCmd(sock, rest, stdout)
	case "handle":
		err = handleCmd(sock, rest, stdout, stderr)
	case "lease":
		err = leaseCmd(sock, rest, stdout, stderr)
	case "mode":
		err = modeCmd(sock, rest, stdout)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "tcctl: unknown command %q\n%s", cmd, usage)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "tcctl: %v\n", explain(err, sock))
		if errors.Is(err, errUsage) {
			return 2
		}
		return 1
	}
	return 0
}

var errUsage = errors.New("usage")

// explain adds what an operator needs to an error: which socket, and what
// the usual cause is.
func explain(err error, sock string) string {
	msg := err.Error()
	switch {
	case errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Sprintf("%s\n(is tensorcastd running? no daemon listens on %s; set --socket or TENSORCAST_SOCKET)", msg, sock)
	case errors.Is(err, syscall.EACCES), errors.Is(err, client.ErrPermissionDenied):
		return fmt.Sprintf("%s\n(this user may not use the daemon at %s: check the socket's mode and the daemon's allowed uids/gids)", msg, sock)
	}
	return msg
}

func dial(sock string, pool bool) (*client.Client, error) {
	return client.Dial(sock, client.Options{Name: "tcctl", NoPool: !pool, CallTimeout: 10 * time.Second})
}

func info(sock string, w io.Writer) error {
	c, err := dial(sock, true)
	if err != nil {
		return err
	}
	defer c.Close()
	h := c.Hello()
	p, _ := c.Pool()
	fmt.Fprintf(w, "socket:           %s\n", sock)
	fmt.Fprintf(w, "daemon id:        %s\n", h.DaemonID)
	fmt.Fprintf(w, "version:          %s\n", h.Version)
	fmt.Fprintf(w, "protocol:         %d\n", h.ProtocolVersion)
	if h.PeerAddr != "" {
		fmt.Fprintf(w, "peer plane:       %s\n", h.PeerAddr)
	} else {
		fmt.Fprintf(w, "peer plane:       off\n")
	}
	fmt.Fprintf(w, "pool:             segment %d, %s\n", p.Segment, bytesStr(p.Size))
	classes := make([]string, len(p.BlockClasses))
	for i, c := range p.BlockClasses {
		classes[i] = bytesStr(c)
	}
	fmt.Fprintf(w, "block classes:    %s\n", strings.Join(classes, " "))
	l := h.Limits
	fmt.Fprintf(w, "limits:           frame %s, buffers %d, blocks %d, batches %d, batch capacity %d, requests/submit %d, idempotency keys %d\n",
		bytesStr(uint64(l.MaxFrame)), l.MaxBuffers, l.MaxBlocks, l.MaxBatches, l.MaxBatchCapacity, l.MaxRequests, l.MaxIdempotencyKeys)
	return nil
}

func stats(sock string, args []string, w, stderr io.Writer) error {
	fs := flag.NewFlagSet("stats", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print the counters as one JSON object")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		return fmt.Errorf("%w: stats [--json]", errUsage)
	}
	c, err := dial(sock, false)
	if err != nil {
		return err
	}
	defer c.Close()
	st, err := c.Stats()
	if err != nil {
		return err
	}
	if *asJSON {
		return writeStatsJSON(w, st)
	}
	fmt.Fprintf(w, "connections %d\n", st.Connections)
	for _, g := range []struct {
		name string
		cs   []wire.Counter
	}{{"pool", st.Pool}, {"engine", st.Engine}, {"transport", st.Transports}, {"store", st.Store}} {
		for _, c := range g.cs {
			fmt.Fprintf(w, "%s.%s %d\n", g.name, c.Name, c.Value)
		}
	}
	return nil
}

func ping(sock string, args []string, w, stderr io.Writer) error {
	fs := flag.NewFlagSet("ping", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n := fs.Int("n", 1, "number of round trips")
	size := fs.Int("size", 0, "payload bytes per ping (control socket only)")
	viaQueue := fs.Bool("queue", false, "round trips through a shared-memory queue (no-op requests) instead of the control socket")
	own := fs.Bool("own", false, "fail unless the daemon runs in this process's pid namespace (a pod's probe of its own daemon, "+
		"where another pod's may answer on the shared socket directory)")
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	if *n < 1 || *n > 100_000_000 || *size < 0 || *size > 64<<10 {
		return fmt.Errorf("%w: -n must be 1..1e8 and -size 0..65536", errUsage)
	}
	if *viaQueue && *size != 0 {
		return fmt.Errorf("%w: a queue round trip carries no payload (-size is for the control socket)", errUsage)
	}
	c, err := dial(sock, false)
	if err != nil {
		return err
	}
	defer c.Close()
	if *own {
		pid, err := c.DaemonPID()
		if err == nil {
			err = ownDaemon(pid)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", sock, err)
		}
	}
	lat := make([]time.Duration, *n)
	start := time.Now()
	if *viaQueue {
		if err := queuePings(c, lat); err != nil {
			return err
		}
	} else {
		payload := make([]byte, *size)
		for i := range lat {
			t0 := time.Now()
			if err := c.Ping(payload); err != nil {
				return err
			}
			lat[i] = time.Since(t0)
		}
	}
	total := time.Since(start)
	via := "the control socket"
	if *viaQueue {
		via = "a queue"
	}
	if *n == 1 {
		fmt.Fprintf(w, "pong from %s (%s) through %s: %v\n", c.Hello().DaemonID, sock, via, lat[0])
		return nil
	}
	slices.Sort(lat)
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	if *viaQueue {
		fmt.Fprintf(w, "%d round trips to %s (%s) through a queue (no-op requests)\n", *n, c.Hello().DaemonID, sock)
	} else {
		fmt.Fprintf(w, "%d round trips to %s (%s), %d-byte payload\n", *n, c.Hello().DaemonID, sock, *size)
	}
	fmt.Fprintf(w, "min %v  avg %v  p50 %v  p99 %v  max %v  %.0f rt/s\n",
		lat[0], sum/time.Duration(len(lat)), pct(0.50), pct(0.99), lat[len(lat)-1], float64(*n)/total.Seconds())
	return nil
}

// ownDaemon is nil when pid, the daemon's as SO_PEERCRED numbers it in
// this pid namespace, is one: 0 is a daemon of another namespace.
func ownDaemon(pid int) error {
	if pid == 0 {
		return errors.New("the daemon answering runs in another pid namespace (another pod's or container's), not this one's")
	}
	return nil
}

// queuePings times one no-op request at a time through a queue of c: the
// latency of the queue itself (submit, the daemon's take, its completion,
// the reap).
func queuePings(c *client.Client, lat []time.Duration) error {
	q, err := c.OpenQueue(2)
	if err != nil {
		return err
	}
	defer q.Close()
	cqes := make([]client.Completion, 1)
	for i := range lat {
		t0 := time.Now()
		if ok, err := q.Nop(uint64(i)); err != nil || !ok {
			return fmt.Errorf("queue nop %d: %v (room %v)", i, err, ok)
		}
		if _, err := q.Reap(cqes, 1, 10*time.Second); err != nil {
			return fmt.Errorf("queue nop %d: %w", i, err)
		}
		if cqes[0].UserData != uint64(i) || cqes[0].Err() != nil {
			return fmt.Errorf("queue nop %d completed as %+v", i, cqes[0])
		}
		lat[i] = time.Since(t0)
	}
	return nil
}

func peers(sock string, args []string, w io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("%w: peers takes no arguments", errUsage)
	}
	c, err := dial(sock, false)
	if err != nil {
		return err
	}
	defer c.Close()
	ps, err := c.Peers()
	if err != nil {
		if errors.Is(err, client.ErrUnavailable) {
			return fmt.Errorf("%w\n(the daemon runs no peer plane: set peer_listen and cluster_key_file)", err)
		}
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tADDR\tEPOCH\tCONNECTED\tBYTES IN\tBYTES OUT\tERRORS")
	for _, p := range ps {
		fmt.Fprintf(tw, "%s\t%s\t%#x\t%v\t%d\t%d\t%d\n", p.ID, p.Addr, p.Epoch, p.Connected, p.BytesIn, p.BytesOut, p.Errors)
	}
	return tw.Flush()
}

func segments(sock string, args []string, w, stderr io.Writer) error {
	fs := flag.NewFlagSet("segments", flag.ContinueOnError)
	fs.SetOutput(stderr)
	remote := fs.Bool("remote", false, "list the remote segments opened through this daemon")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		return fmt.Errorf("%w: segments [--remote]", errUsage)
	}
	c, err := dial(sock, false)
	if err != nil {
		return err
	}
	defer c.Close()
	ss, err := c.Segments()
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if *remote {
		fmt.Fprintln(tw, "PEER\tNAME\tID\tSIZE\tRIGHTS\tEPOCH\tTRANSPORT")
	} else {
		fmt.Fprintln(tw, "NAME\tSEGMENT\tSIZE\tRIGHTS\tGRANTS")
	}
	for _, s := range ss {
		switch {
		case *remote && s.Peer != "":
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%#x\t%s\n", s.Peer, s.Name, s.ID, bytesStr(s.Size), rightsStr(s.Rights), s.Epoch,
				wire.TransportName(s.Transport))
		case !*remote && s.Peer == "":
			g := "-"
			if len(s.Grants) > 0 {
				g = strings.Join(s.Grants, ",")
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", s.Name, s.ID, bytesStr(s.Size), rightsStr(s.Rights), g)
		}
	}
	return tw.Flush()
}

func rdmaCmd(sock string, args []string, w io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("%w: rdma takes no arguments", errUsage)
	}
	c, err := dial(sock, false)
	if err != nil {
		return err
	}
	defer c.Close()
	r, err := c.RDMA()
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "state:    %s\n", strings.ToLower(r.State.String()))
	if r.State != client.RDMAEnabled {
		fmt.Fprintf(w, "reason:   %s\n", r.Reason)
		return nil
	}
	fmt.Fprintf(w, "device:   %s port %d\n", r.Device, r.Port)
	fmt.Fprintf(w, "gid:      %s (index %d)\n", r.GID, r.GIDIndex)
	fmt.Fprintf(w, "mtu:      %d\n", r.MTU)
	fmt.Fprintf(w, "lid:      %d\n", r.LID)
	fmt.Fprintf(w, "pool:     %s registered, %d MRs\n", bytesStr(r.PoolRegistered), r.PoolMRs)
	if len(r.Peers) == 0 {
		fmt.Fprintf(w, "peers:    none\n")
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PEER\tTRANSPORT\tLINK\tEPOCH\tQPS\tSEGMENTS\tACCEPTING")
	for _, p := range r.Peers {
		epoch, qps, acc := "-", "-", "no"
		if p.Link == "up" {
			epoch, qps = fmt.Sprintf("%#x", p.Epoch), strconv.FormatUint(uint64(p.QueuePairs), 10)
		}
		if p.Accepting {
			acc = fmt.Sprintf("epoch %#x", p.AcceptedEpoch)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", p.ID, p.Transport, p.Link, epoch, qps, p.Segments, acc)
	}
	return tw.Flush()
}

func rightsStr(r uint8) string {
	s := ""
	if r&client.RightRead != 0 {
		s += "r"
	}
	if r&client.RightWrite != 0 {
		s += "w"
	}
	return s
}

func bytesStr(n uint64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
