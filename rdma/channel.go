package rdma

import (
	"fmt"
	"time"
)

// ExchangeKind names queue-pair connection data on the peer channel.
const ExchangeKind = "rdma.connect"

// Exchanger is the daemons' authenticated peer channel (tcp.Node): a
// request/response exchange with a named peer's handler of a kind.
type Exchanger interface {
	Exchange(peer, kind string, req []byte, timeout time.Duration) ([]byte, error)
}

// ChannelPeer is a Peer over the peer channel: Exchange sends the local
// ConnInfo (queue pair and exposed regions) to daemon ID, whose handler
// (Acceptor) brings its queue pair up and answers with its own.
type ChannelPeer struct {
	Ch Exchanger
	ID string
	// Timeout bounds one exchange (0: the channel's default).
	Timeout time.Duration
}

var _ Peer = ChannelPeer{}

// Exchange implements Peer.
func (p ChannelPeer) Exchange(local ConnInfo) (ConnInfo, error) {
	req, err := local.MarshalBinary()
	if err != nil {
		return ConnInfo{}, err
	}
	resp, err := p.Ch.Exchange(p.ID, ExchangeKind, req, p.Timeout)
	if err != nil {
		return ConnInfo{}, err
	}
	var remote ConnInfo
	if err := remote.UnmarshalBinary(resp); err != nil {
		return ConnInfo{}, fmt.Errorf("answer of %s: %w", p.ID, err)
	}
	if remote.QPIndex != local.QPIndex {
		return ConnInfo{}, fmt.Errorf("%w: %s answered for queue pair %d, asked for %d", ErrConnInfo, p.ID, remote.QPIndex, local.QPIndex)
	}
	return remote, nil
}

// Acceptor returns the peer-channel handler of ExchangeKind: it decodes a
// peer's ConnInfo, asks lookup for the transport that accepts that peer's
// queue pairs (lookup may create it; epoch tells a restarted peer apart),
// brings the queue pair up with Accept and answers with the local
// ConnInfo.
func Acceptor(lookup func(from string, epoch uint64) (*Transport, error)) func(from string, epoch uint64, req []byte) ([]byte, error) {
	return func(from string, epoch uint64, req []byte) ([]byte, error) {
		var remote ConnInfo
		if err := remote.UnmarshalBinary(req); err != nil {
			return nil, err
		}
		t, err := lookup(from, epoch)
		if err != nil {
			return nil, err
		}
		local, err := t.Accept(remote)
		if err != nil {
			return nil, err
		}
		return local.MarshalBinary()
	}
}
