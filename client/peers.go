package client

import (
	"fmt"
	"slices"
	"time"

	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// Rights on an exported or opened remote segment.
const (
	RightRead  = wire.RightRead
	RightWrite = wire.RightWrite
)

// MaxNotify is the largest notification a WRITE may carry.
const MaxNotify = wire.MaxNotify

// Notification is one notification a peer attached to a WRITE into a
// segment this client subscribed to.
type Notification struct {
	Segment string
	Payload []byte
}

// Peer is one peer daemon as the daemon sees it.
type Peer struct {
	ID, Addr          string
	Epoch             uint64
	Connected         bool
	BytesIn, BytesOut uint64
	Errors            uint64
}

// SegmentInfo is a segment this daemon exports (Peer empty; ID is the
// exported buffer or the pool) or a remote one opened through it (Peer
// set; ID is the id requests name).
type SegmentInfo struct {
	Name   string
	Peer   string
	ID     xfer.SegmentID
	Size   uint64
	Rights uint8
	Epoch  uint64
	// Transport is how a remote segment's requests travel (TransportAuto,
	// TransportTCP, TransportRDMA).
	Transport uint8
	// Grants are the other tenants an export grants (ExportSegmentTo).
	Grants []string
}

// RemoteSegment is a peer's segment opened with OpenRemote; ID is usable as
// a request target.
type RemoteSegment struct {
	ID    xfer.SegmentID
	Size  uint64
	Epoch uint64
}

// ExportSegment makes [off, off+length) of segment (a buffer this client
// registered, length 0 = to its end, or the pool, within blocks it holds)
// reachable by peers as name, with rights (RightRead, RightWrite or both).
// The name is this client's tenant's: the clients of that tenant on peer
// daemons open it as "daemon/name", and no other tenant's. It returns the
// exported size. The export ends with UnexportSegment or when the
// connection closes.
func (c *Client) ExportSegment(name string, segment xfer.SegmentID, off, length uint64, rights uint8, opts ...CallOption) (uint64, error) {
	return c.ExportSegmentTo(name, nil, segment, off, length, rights, opts...)
}

// ExportSegmentTo is ExportSegment that also lets the clients of the
// tenants grants (at most 16, never the exporter's own) on peer daemons
// open the export, as "daemon/tenant/name" where tenant is the exporter's.
func (c *Client) ExportSegmentTo(name string, grants []string, segment xfer.SegmentID, off, length uint64, rights uint8, opts ...CallOption) (uint64, error) {
	if name == "" {
		return 0, fmt.Errorf("%w: empty name", ErrInvalidArgument)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	*wire.SetRequest[wire.ExportSegmentRequest](c.start(opts)) = wire.ExportSegmentRequest{Name: []byte(name),
		Segment: uint64(segment), Offset: off, Length: length, Rights: rights, Grants: grants}
	r, err := call[wire.ExportSegmentResponse](c, noFD, nil)
	if err != nil {
		return 0, err
	}
	return r.Size, nil
}

// UnexportSegment ends an export of this client.
func (c *Client) UnexportSegment(name string, opts ...CallOption) error {
	if name == "" {
		return fmt.Errorf("%w: empty name", ErrInvalidArgument)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	wire.SetRequest[wire.UnexportSegmentRequest](c.start(opts)).Name = []byte(name)
	_, err := call[wire.UnexportSegmentResponse](c, noFD, nil)
	return err
}

// OpenRemote opens "peer/segment" (the export of this client's tenant's
// name on daemon peer) or "peer/tenant/segment" (another tenant's that
// grants this client's) with rights. The segment stays open until
// CloseRemote or the connection closes; after the peer restarts it must be
// opened again.
func (c *Client) OpenRemote(name string, rights uint8, opts ...CallOption) (RemoteSegment, error) {
	return c.OpenRemoteVia(name, rights, TransportAuto, opts...)
}

// How requests to a remote segment travel (OpenRemoteVia).
const (
	// TransportAuto: RDMA when both daemons have a usable device, else tcp.
	TransportAuto = wire.TransportAuto
	// TransportTCP: always tcp.
	TransportTCP = wire.TransportTCP
	// TransportRDMA: RDMA or a failed request, never tcp. The open fails
	// (UNAVAILABLE) when RDMA to the peer cannot be set up.
	TransportRDMA = wire.TransportRDMA
)

// OpenRemoteVia is OpenRemote with the transport its requests must use.
func (c *Client) OpenRemoteVia(name string, rights, transport uint8, opts ...CallOption) (RemoteSegment, error) {
	if name == "" {
		return RemoteSegment{}, fmt.Errorf("%w: empty name", ErrInvalidArgument)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	*wire.SetRequest[wire.OpenRemoteRequest](c.start(opts)) = wire.OpenRemoteRequest{Name: []byte(name), Rights: rights,
		Transport: transport}
	r, err := call[wire.OpenRemoteResponse](c, noFD, nil)
	if err != nil {
		return RemoteSegment{}, err
	}
	return RemoteSegment{ID: xfer.SegmentID(r.Segment), Size: r.Size, Epoch: r.Epoch}, nil
}

// CloseRemote closes a remote segment this client opened.
func (c *Client) CloseRemote(id xfer.SegmentID, opts ...CallOption) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	wire.SetRequest[wire.CloseRemoteRequest](c.start(opts)).Segment = uint64(id)
	_, err := call[wire.CloseRemoteResponse](c, noFD, nil)
	return err
}

// Subscribe makes this client receive the notifications peers attach to
// WRITEs into the segment exported as name on this daemon.
func (c *Client) Subscribe(name string, opts ...CallOption) error {
	if name == "" {
		return fmt.Errorf("%w: empty name", ErrInvalidArgument)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	wire.SetRequest[wire.SubscribeRequest](c.start(opts)).Name = []byte(name)
	_, err := call[wire.SubscribeResponse](c, noFD, nil)
	return err
}

// PollNotifications returns up to max queued notifications (max 0: as
// many as fit one answer), waiting up to timeout for the first (0: do not
// wait). It appends to dst.
func (c *Client) PollNotifications(dst []Notification, max int, timeout time.Duration, opts ...CallOption) ([]Notification, error) {
	if max < 0 || max > 1<<31 {
		return dst, fmt.Errorf("%w: max %d", ErrInvalidArgument, max)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	m := wire.SetRequest[wire.PollNotificationsRequest](c.start(opts))
	m.Max, m.TimeoutMS = uint32(max), millis(timeout)
	if timeout > 0 || c.req.Ctx.DeadlineMS > 0 {
		c.holdFor(timeout) // else the daemon answers at once
	}
	r, err := call[wire.PollNotificationsResponse](c, noFD, nil)
	if err != nil {
		return dst, err
	}
	if max > 0 && len(r.Notifications) > max {
		return dst, c.fail(fmt.Errorf("%w: %d notifications for at most %d", ErrProtocol, len(r.Notifications), max))
	}
	for _, n := range r.Notifications {
		dst = append(dst, Notification{Segment: string(n.Segment), Payload: slices.Clone(n.Payload)})
	}
	return dst, nil
}

// Peers lists the peer daemons.
func (c *Client) Peers(opts ...CallOption) ([]Peer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	wire.SetRequest[wire.PeersRequest](c.start(opts))
	r, err := call[wire.PeersResponse](c, noFD, nil)
	if err != nil {
		return nil, err
	}
	out := make([]Peer, len(r.Peers))
	for i, p := range r.Peers {
		out[i] = Peer{ID: string(p.ID), Addr: string(p.Addr), Epoch: p.Epoch, Connected: p.Connected,
			BytesIn: p.BytesIn, BytesOut: p.BytesOut, Errors: p.Errors}
	}
	return out, nil
}

// Segments lists the segments the daemon exports and the remote ones its
// clients opened.
func (c *Client) Segments(opts ...CallOption) ([]SegmentInfo, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	wire.SetRequest[wire.SegmentsRequest](c.start(opts))
	r, err := call[wire.SegmentsResponse](c, noFD, nil)
	if err != nil {
		return nil, err
	}
	out := make([]SegmentInfo, len(r.Segments))
	for i, s := range r.Segments {
		out[i] = SegmentInfo{Name: string(s.Name), Peer: string(s.Peer), ID: xfer.SegmentID(s.Segment), Size: s.Size,
			Rights: s.Rights, Epoch: s.Epoch, Transport: s.Transport, Grants: slices.Clone(s.Grants)}
	}
	return out, nil
}

// checkNotify checks a positional notify slice: empty, or one entry per
// request (nil for none), each at most MaxNotify bytes.
func checkNotify(notify [][]byte, n int) error {
	if len(notify) != 0 && len(notify) != n {
		return fmt.Errorf("%w: %d notifications for %d requests", ErrInvalidArgument, len(notify), n)
	}
	for i, p := range notify {
		if len(p) > MaxNotify {
			return fmt.Errorf("%w: notification %d has %d bytes (max %d)", ErrInvalidArgument, i, len(p), MaxNotify)
		}
	}
	return nil
}

// SubmitNotify is Submit with notifications: notify[i] (nil for none)
// rides on reqs[i], a WRITE to a remote segment; that task completes only
// once the target daemon delivered it to a subscribed client and
// acknowledged it.
func (c *Client) SubmitNotify(batch xfer.BatchID, reqs []xfer.Request, notify [][]byte, results []error, opts ...CallOption) error {
	if err := checkNotify(notify, len(reqs)); err != nil {
		return err
	}
	return c.submit(batch, reqs, notify, results, opts)
}

// TransferNotify is Transfer with notifications, as SubmitNotify.
func (c *Client) TransferNotify(reqs []xfer.Request, notify [][]byte, timeout time.Duration, results []error, opts ...CallOption) (Summary, error) {
	if err := checkNotify(notify, len(reqs)); err != nil {
		return Summary{}, err
	}
	return c.transfer(reqs, notify, timeout, results, opts)
}
