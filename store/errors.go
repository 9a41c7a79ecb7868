package store

import (
	"fmt"

	"github.com/tensorcast/tensorcast/xfer"
)

// Sentinel errors of package store. Match them with errors.Is; returned
// errors wrap them with detail.
//
// A call's returned error is for the whole call (its arguments, or the store
// being closed): every code of the call then carries the same code. What
// happened to one key is its code, plus, when the caller passed an errs
// slice, the detailed error at the key's position.
var (
	// ErrClosed: the store or the session is closed (or closing). Matches
	// xfer.ErrClosed.
	ErrClosed = fmt.Errorf("store: %w", xfer.ErrClosed)
	// ErrBadCall: the call's slices disagree in length, or it carries more
	// keys than Config.MaxKeysPerCall. Nothing was done.
	ErrBadCall = xfer.Categorized(xfer.ErrInvalid, "store: malformed call")
	// ErrConfig: a Config or L2 value is out of range. Matches
	// xfer.ErrInvalid, a start-up error.
	ErrConfig = xfer.Categorized(xfer.ErrInvalid, "store: invalid config")
	// ErrNoL2: a durable put on a store without a second tier.
	ErrNoL2 = xfer.Categorized(xfer.ErrPrecondition, "store: no L2 tier configured")

	// Per-key errors (the detail behind a key's code).

	// ErrBadKey: a key is empty or longer than Config.MaxKeyLen.
	ErrBadKey = xfer.Categorized(xfer.ErrInvalid, "store: key empty or too long")
	// ErrBadSize: a value of size 0 or over Config.MaxValueSize.
	ErrBadSize = xfer.Categorized(xfer.ErrInvalid, "store: value size out of range")
	// ErrShortBuffer: a destination is smaller than the value.
	ErrShortBuffer = xfer.Categorized(xfer.ErrInvalid, "store: destination smaller than the value")
	// ErrFault: a copy touched memory that is no longer mapped.
	ErrFault = xfer.Categorized(xfer.ErrPrecondition, "store: memory fault in a copy")
	// ErrPinned: the key is pinned (Remove refuses it).
	ErrPinned = xfer.Categorized(xfer.ErrPrecondition, "store: key is pinned")
	// ErrBusy: the key has a caller's put, promotion, copy or removal in
	// flight; try again. The store's own background work (a writeback) is
	// never answered with it.
	ErrBusy = xfer.Categorized(xfer.ErrBusy, "store: key busy")
	// ErrExists: the key is already stored.
	ErrExists = xfer.Categorized(xfer.ErrAlreadyExists, "store: key exists")
	// ErrNotFound: the key is not stored.
	ErrNotFound = xfer.Categorized(xfer.ErrNotFound, "store: key not found")
	// ErrNotReserved: a commit or abort of a key this session has not
	// reserved (or has committed or aborted already).
	ErrNotReserved = xfer.Categorized(xfer.ErrPrecondition, "store: key not reserved by this session")
	// ErrUnderflow: an unpin of a key this session does not hold pinned.
	ErrUnderflow = xfer.Categorized(xfer.ErrPrecondition, "store: unpin below zero")
	// ErrOverflow: a pin past Config.MaxPins on one key.
	ErrOverflow = xfer.Categorized(xfer.ErrBackpressure, "store: pin count overflow")
	// ErrNotApplied: another key of an all-or-nothing batch (Pin, Unpin)
	// failed, so this one was not applied either.
	ErrNotApplied = xfer.Categorized(xfer.ErrPrecondition, "store: batch not applied")
	// ErrL1Full: the pool has no room the store may take, even after
	// evicting what it could.
	ErrL1Full = xfer.Categorized(xfer.ErrBackpressure, "store: L1 full")
	// ErrReserveLimit: the session holds Config.MaxSessionReserved bytes of
	// reservations already.
	ErrReserveLimit = xfer.Categorized(xfer.ErrBackpressure, "store: the session's reservations are at their limit")
	// ErrPinLimit: a pin of a value the session does not hold pinned yet
	// would take the bytes of the values it holds pinned past
	// Config.MaxSessionPinned.
	ErrPinLimit = xfer.Categorized(xfer.ErrBackpressure, "store: the session's pins are at their limit")
	// ErrL2Full: the second tier has no free slot of the needed size.
	ErrL2Full = xfer.Categorized(xfer.ErrBackpressure, "store: L2 full")
	// ErrCorrupt: a block read from L2 does not match its checksum; the key
	// is dropped. Matches xfer.ErrNotFound: the key is gone, as every later
	// call about it says, and its owner puts it again as after any miss.
	ErrCorrupt = xfer.Categorized(xfer.ErrNotFound, "store: L2 block corrupt")
	// ErrTransport: the L2 transport broke the xfer.Transport contract (a
	// dispatch count outside 0..n, a short count without an error, a second
	// Done). The call fails as a whole; what the transport may still touch is
	// quarantined, never reused. It matches xfer.ErrTransport and no
	// category: a transport that breaks its contract is a bug, INTERNAL.
	ErrTransport = fmt.Errorf("store: %w", xfer.ErrTransport)
	// ErrL2Format: the L2 file has a superblock that is not tensorcast's or
	// is damaged; the store refuses to overwrite it. Matches
	// xfer.ErrPrecondition: the file is not in a state the store may use, a
	// start-up error.
	ErrL2Format = xfer.Categorized(xfer.ErrPrecondition, "store: L2 file format")
)
