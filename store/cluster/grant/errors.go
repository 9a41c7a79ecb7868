package grant

import (
	"fmt"

	"github.com/tensorcast/tensorcast/xfer"
)

// Sentinel errors of package grant. Match them with errors.Is; returned
// errors wrap them with detail (the ids, counts and limits involved), which
// go to the daemon's log, never to a client.
var (
	// ErrClosed: the claims table, handle issuer, lease table or admission
	// is closed (the daemon is draining).
	ErrClosed = fmt.Errorf("grant: %w", xfer.ErrClosed)
	// ErrInvalid: an argument is out of range: no keys, an empty or
	// over-long key or operation id, a TTL of zero or over the limit, no
	// holders for a claim, an unknown mode.
	ErrInvalid = xfer.Categorized(xfer.ErrInvalid, "grant: invalid argument")

	// Claims.

	// ErrBusy: every holder of the key already has as many readers of it
	// as it admits (or as many readers in all); the reader tries again
	// later or reads elsewhere.
	ErrBusy = xfer.Categorized(xfer.ErrBusy, "grant: every holder of the key is at its reader limit")
	// ErrClaimNotFound: a release of a claim that is not outstanding
	// (released already, expired, or never granted).
	ErrClaimNotFound = xfer.Categorized(xfer.ErrNotFound, "grant: claim not outstanding")
	// ErrNotClaimHolder: a release of a claim another reader took (another
	// daemon, or another run of the releasing one). Nothing is released.
	ErrNotClaimHolder = xfer.Categorized(xfer.ErrPermission, "grant: claim held by another reader")

	// Retention handles. Every refusal of a token is PERMISSION_DENIED:
	// whatever is uncertain about a token is refused (fail closed).

	// ErrForged: the token does not decode or its signature is not the
	// cluster's.
	ErrForged = xfer.Categorized(xfer.ErrPermission, "grant: retention handle token malformed or not signed by the cluster")
	// ErrExpired: the token's expiry has passed (or the handle is gone at
	// its issuer: released or expired).
	ErrExpired = xfer.Categorized(xfer.ErrPermission, "grant: retention handle expired or released")
	// ErrForeignEpoch: the token was issued by its daemon in another run
	// (epoch) than the one now known for it: the issuer restarted.
	ErrForeignEpoch = xfer.Categorized(xfer.ErrPermission, "grant: retention handle issued in another epoch")
	// ErrUnknownIssuer: the token names an issuer that is not a known
	// member now (gone, or not known for certain).
	ErrUnknownIssuer = xfer.Categorized(xfer.ErrPermission, "grant: retention handle issuer unknown")
	// ErrKeysMismatch: the keys presented with a token are not the key set
	// it was issued for.
	ErrKeysMismatch = xfer.Categorized(xfer.ErrPermission, "grant: keys are not the retention handle's")
	// ErrNotIssuer: a renewal or release of a handle this daemon did not
	// issue, with no route to its issuer. Handles are renewed and
	// released only at their issuer.
	ErrNotIssuer = xfer.Categorized(xfer.ErrPrecondition, "grant: retention handle issued by another daemon")
	// ErrHandleLimit: the issuer holds Config.MaxHandles live handles.
	ErrHandleLimit = xfer.Categorized(xfer.ErrBackpressure, "grant: too many retention handles")
	// ErrTooManyKeys: a handle or lease names more keys than its limit.
	ErrTooManyKeys = xfer.Categorized(xfer.ErrBackpressure, "grant: too many keys for one handle or lease")
	// ErrPinLimit: the values of a new handle or lease would take the
	// bytes its store's handles and leases hold pinned in all past their
	// PinBudget. Nothing is pinned.
	ErrPinLimit = xfer.Categorized(xfer.ErrBackpressure, "grant: the handles and leases pin their limit of bytes")

	// Placement leases.

	// ErrLeaseConflict: a create with an operation id that a live lease
	// already has, for another key set. The first lease stands.
	ErrLeaseConflict = xfer.Categorized(xfer.ErrPrecondition, "grant: operation id already names a lease of other keys")
	// ErrLeaseEnded: a create with the operation id of a lease that was
	// released (or expired) lately: a late retry, which must not pin again.
	ErrLeaseEnded = xfer.Categorized(xfer.ErrPrecondition, "grant: operation id names a lease that has ended")
	// ErrLeaseNotFound: a release of an operation id that names no lease.
	ErrLeaseNotFound = xfer.Categorized(xfer.ErrNotFound, "grant: no placement lease with that operation id")
	// ErrLeaseLimit: the table holds Config.MaxLeases leases.
	ErrLeaseLimit = xfer.Categorized(xfer.ErrBackpressure, "grant: too many placement leases")

	// Modes.

	// ErrOverBudget: remote work refused by the mode's admission budget
	// (remote gets in flight, or bytes per second served to other hosts).
	ErrOverBudget = xfer.Categorized(xfer.ErrBackpressure, "grant: remote work over the mode's budget")
)
