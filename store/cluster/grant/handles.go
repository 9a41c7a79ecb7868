package grant

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// Handles is a daemon's role of issuer of retention handles (seed 003): a
// handle keeps a set of keys from eviction until it is released or
// expires; it is a signed token naming its issuer (daemon id and epoch),
// and it is renewed and released only at that issuer. Any daemon of the
// cluster can verify a token; whatever is uncertain about one (signature,
// expiry, an issuer gone or restarted) makes it invalid: fail closed.
//
// A handle's pins are taken through Config.Pinner when it is issued and
// given back when it is released, when it expires (a timer on the clock,
// nothing to poll) and when Handles closes.
type Handles struct {
	cfg HandlesConfig

	// mu guards the fields below. Pins are taken and given back outside
	// it (Pinner calls may lock the store's shards or go to peers).
	mu      sync.Mutex
	closed  bool
	next    uint64
	live    map[uint64]*handle
	keys    int // keys held by the live handles
	sched   sched
	scratch []deadline
	stats   HandleStats
}

// HandlesConfig configures Handles.
type HandlesConfig struct {
	// DaemonID and Epoch are this daemon's, as its peers know it: the
	// issuer a token names.
	DaemonID string
	Epoch    uint64
	// Scope names the store the handles pin in (the tenant; at most 64
	// bytes): tokens of another scope are refused, so one tenant's token
	// never renews, releases or proves another's handle.
	Scope string
	// Key signs and checks tokens: derived from the cluster key, so every
	// daemon of the cluster checks every other's tokens. At least 16
	// bytes.
	Key []byte
	// Pinner takes a handle's pins (required).
	Pinner Pinner
	// Members tells the epoch a daemon id is known by now, for tokens of
	// other issuers (nil: only this daemon's tokens verify).
	Members Members
	// Router carries renewals and releases of other issuers' tokens to
	// them (nil: those are refused with ErrNotIssuer).
	Router Router
	// MaxHandles bounds the live handles (default 4096); MaxKeys the keys
	// of one handle (default 1024); MaxTTL a handle's time to live from
	// an issue or renewal (default 1 h).
	MaxHandles int
	MaxKeys    int
	MaxTTL     time.Duration
	// Clock is the time source (default the wall clock); Log where issues,
	// renewals, releases and expiries are logged (default: discarded).
	Clock Clock
	Log   *slog.Logger
}

// Members is the membership as the issuer check needs it: the epoch a
// daemon is known by now, and whether it is known for certain. A member
// that is gone, or whose state is uncertain (the directory's view is
// older than its staleness budget), is not ok.
type Members interface {
	Epoch(daemonID string) (epoch uint64, ok bool)
}

// Router carries a renewal or release to the token's issuer (the cluster's
// peer plane, routing by daemon id); the issuer answers from its own
// Handles. Errors wrap the categories of this package (ErrExpired from
// the issuer, say) or xfer.ErrUnavailable when the issuer cannot be
// reached. Handles checks a renewal's answer before it hands it on: a
// token that is not the handle's is refused.
type Router interface {
	Renew(t Token, token []byte, ttl time.Duration) (Handle, error)
	Release(t Token, token []byte) error
}

// Handle is an issued (or renewed) handle: its token and what it says.
type Handle struct {
	Token  []byte
	Issuer string
	ID     uint64
	Expiry time.Time
	Keys   int
}

// HandleStats are the issuer's counters.
type HandleStats struct {
	Live     uint64 // handles live now
	Keys     uint64 // keys they hold
	Issued   uint64
	Renewed  uint64
	Released uint64
	Expired  uint64
	Refused  uint64 // tokens refused by Verify, Renew or Release
}

type handle struct {
	expiry time.Time
	ver    uint32
	digest [digestLen]byte
	nkeys  int
	hold   Hold
}

// NewHandles makes an issuer.
func NewHandles(cfg HandlesConfig) (*Handles, error) {
	switch {
	case cfg.DaemonID == "" || len(cfg.DaemonID) > maxIssuerLen:
		return nil, fmt.Errorf("%w: daemon id %q (1..%d bytes)", ErrInvalid, cfg.DaemonID, maxIssuerLen)
	case len(cfg.Scope) > maxScopeLen:
		return nil, fmt.Errorf("%w: scope of %d bytes (at most %d)", ErrInvalid, len(cfg.Scope), maxScopeLen)
	case len(cfg.Key) < 16:
		return nil, fmt.Errorf("%w: a token key of %d bytes (at least 16)", ErrInvalid, len(cfg.Key))
	case cfg.Pinner == nil:
		return nil, fmt.Errorf("%w: no Pinner", ErrInvalid)
	case cfg.MaxTTL > maxRouteTTLms*time.Millisecond:
		return nil, fmt.Errorf("%w: MaxTTL %v (at most %v, what a renewal routed to the issuer carries)", ErrInvalid, cfg.MaxTTL, maxRouteTTLms*time.Millisecond)
	}
	if cfg.MaxHandles <= 0 {
		cfg.MaxHandles = 4096
	}
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = 1024
	}
	if cfg.MaxTTL <= 0 {
		cfg.MaxTTL = time.Hour
	}
	if cfg.Clock == nil {
		cfg.Clock = wallClock{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	h := &Handles{cfg: cfg, live: map[uint64]*handle{}}
	h.sched = sched{clock: cfg.Clock, fire: h.expire}
	return h, nil
}

// DaemonID is the issuer's id.
func (h *Handles) DaemonID() string { return h.cfg.DaemonID }

func (h *Handles) checkTTL(ttl time.Duration) error {
	if ttl <= 0 || ttl > h.cfg.MaxTTL {
		return fmt.Errorf("%w: ttl %v (want (0, %v])", ErrInvalid, ttl, h.cfg.MaxTTL)
	}
	return nil
}

// Issue pins keys and returns a handle on them for ttl. The keys must all
// be pinnable (stored, for the local pinner), or nothing is held.
func (h *Handles) Issue(keys [][]byte, ttl time.Duration) (Handle, error) {
	if err := checkKeys(keys, h.cfg.MaxKeys); err != nil {
		return Handle{}, err
	}
	if err := h.checkTTL(ttl); err != nil {
		return Handle{}, err
	}
	// Reserve the slot first, so that a full issuer pins nothing.
	h.mu.Lock()
	switch {
	case h.closed:
		h.mu.Unlock()
		return Handle{}, ErrClosed
	case len(h.live) >= h.cfg.MaxHandles:
		h.mu.Unlock()
		return Handle{}, fmt.Errorf("%w: %d live", ErrHandleLimit, len(h.live))
	}
	h.next++
	id := h.next
	hd := &handle{digest: KeysDigest(keys), nkeys: len(keys)}
	h.live[id] = hd // reserved: no hold yet, no deadline

	// The expiry counts from before the pins are taken: their TTL runs
	// from when each was taken, and a handle that counted from after a
	// slow Pin would stay valid over keys no longer pinned.
	start := h.cfg.Clock.Now()
	hold, err := pinUnlocked(&h.mu, &h.closed, h.cfg.Pinner, keys, ttl)
	if err != nil {
		delete(h.live, id)
		h.mu.Unlock()
		return Handle{}, err
	}
	defer h.mu.Unlock()
	hd.hold = hold
	hd.expiry = start.Add(ttl)
	h.keys += len(keys)
	h.stats.Issued++
	h.sched.add(hd.expiry, id, hd.ver)
	h.cfg.Log.Debug("retention handle issued", "handle", id, "keys", len(keys), "expiry", hd.expiry)
	return h.token(id, hd), nil
}

// token signs hd's token. h.mu is held.
func (h *Handles) token(id uint64, hd *handle) Handle {
	t := Token{Issuer: h.cfg.DaemonID, Scope: h.cfg.Scope, Epoch: h.cfg.Epoch, ID: id, Expiry: hd.expiry, Keys: uint32(hd.nkeys), Digest: hd.digest}
	return Handle{Token: t.sign(h.cfg.Key), Issuer: h.cfg.DaemonID, ID: id, Expiry: hd.expiry, Keys: hd.nkeys}
}

// Verify checks token (and, when keys is not nil, that they are the key
// set it was issued for) and says what it names. A token of this daemon
// must name a live handle of this epoch; one of another issuer must name a
// member known now by the token's epoch. Every refusal is
// PERMISSION_DENIED (ErrForged, ErrExpired, ErrForeignEpoch,
// ErrUnknownIssuer, ErrKeysMismatch).
func (h *Handles) Verify(token []byte, keys [][]byte) (Token, error) {
	t, err := h.verify(token, keys)
	if err != nil {
		h.mu.Lock()
		h.stats.Refused++
		h.mu.Unlock()
	}
	return t, err
}

// open decodes and authenticates token and checks its scope.
func (h *Handles) open(token []byte) (Token, error) {
	t, err := openToken(token, h.cfg.Key)
	if err == nil && t.Scope != h.cfg.Scope {
		err = fmt.Errorf("%w: a token of scope %q, this is %q", ErrForged, t.Scope, h.cfg.Scope)
	}
	return t, err
}

func (h *Handles) verify(token []byte, keys [][]byte) (Token, error) {
	t, err := h.open(token)
	if err != nil {
		return t, err
	}
	if keys != nil && (len(keys) != int(t.Keys) || KeysDigest(keys) != t.Digest) {
		return t, fmt.Errorf("%w: %d keys presented, handle %d of %s has %d", ErrKeysMismatch, len(keys), t.ID, t.Issuer, t.Keys)
	}
	if t.Issuer != h.cfg.DaemonID {
		return t, h.checkForeign(t)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err = h.ownLocked(t)
	return t, err
}

// checkForeign checks the issuer and expiry of another daemon's token.
func (h *Handles) checkForeign(t Token) error {
	if h.cfg.Members == nil {
		return fmt.Errorf("%w: %q (this daemon knows no members)", ErrUnknownIssuer, t.Issuer)
	}
	ep, ok := h.cfg.Members.Epoch(t.Issuer)
	switch {
	case !ok:
		return fmt.Errorf("%w: %q", ErrUnknownIssuer, t.Issuer)
	case ep != t.Epoch:
		return fmt.Errorf("%w: %q issued it in epoch %#x, is in epoch %#x", ErrForeignEpoch, t.Issuer, t.Epoch, ep)
	case !h.cfg.Clock.Now().Before(t.Expiry):
		return fmt.Errorf("%w: handle %d of %q at %v", ErrExpired, t.ID, t.Issuer, t.Expiry)
	}
	return nil
}

// ownLocked checks a token of this daemon against the live handles. The
// token must be the handle's current one or an older one of it that has
// not expired: a renewal does not revoke the token it renewed. h.mu is
// held.
func (h *Handles) ownLocked(t Token) (*handle, error) {
	if t.Epoch != h.cfg.Epoch {
		return nil, fmt.Errorf("%w: handle %d issued in epoch %#x, this is %#x", ErrForeignEpoch, t.ID, t.Epoch, h.cfg.Epoch)
	}
	hd, ok := h.live[t.ID]
	now := h.cfg.Clock.Now()
	switch {
	case !ok || hd.hold == nil || hd.digest != t.Digest:
		return nil, fmt.Errorf("%w: handle %d is not live", ErrExpired, t.ID)
	case !now.Before(t.Expiry) || !now.Before(hd.expiry):
		return nil, fmt.Errorf("%w: handle %d at %v", ErrExpired, t.ID, t.Expiry)
	}
	return hd, nil
}

// Renew extends the handle of token to ttl from now and returns its new
// token. Only the issuer renews: another daemon's token goes to
// Config.Router, or is refused with ErrNotIssuer.
func (h *Handles) Renew(token []byte, ttl time.Duration) (Handle, error) {
	if err := h.checkTTL(ttl); err != nil {
		return Handle{}, err
	}
	t, err := h.opened(token)
	if err != nil {
		return Handle{}, err
	}
	if t.Issuer != h.cfg.DaemonID && h.cfg.Router != nil {
		hd, err := h.cfg.Router.Renew(t, token, ttl)
		if err != nil {
			return Handle{}, err
		}
		return h.checkRenewed(t, hd)
	}
	return h.renewOwn(t, ttl)
}

// checkRenewed checks the issuer's answer to a routed renewal of t: the
// client goes on with the token it carries, so it must be one the cluster
// signed, of the same handle (issuer, epoch, id, scope, keys), and the
// expiry answered is the one that token says. Anything else is refused
// (fail closed) as UNAVAILABLE, never handed on as a renewal; the token
// the client holds stays as good as it was.
func (h *Handles) checkRenewed(t Token, hd Handle) (Handle, error) {
	nt, err := h.open(hd.Token)
	if err != nil {
		return Handle{}, fmt.Errorf("%w: handle %d: its issuer %q answered the renewal with a bad token: %v", xfer.ErrUnavailable, t.ID, t.Issuer, err)
	}
	if nt.Issuer != t.Issuer || nt.Epoch != t.Epoch || nt.ID != t.ID || nt.Keys != t.Keys || nt.Digest != t.Digest {
		return Handle{}, fmt.Errorf("%w: handle %d: its issuer %q answered the renewal with a token of handle %d of %q",
			xfer.ErrUnavailable, t.ID, t.Issuer, nt.ID, nt.Issuer)
	}
	hd.Issuer, hd.ID, hd.Keys, hd.Expiry = nt.Issuer, nt.ID, int(nt.Keys), nt.Expiry
	return hd, nil
}

// renewOwn renews a handle of this issuer: a token of another is
// ErrNotIssuer (a routed renewal is never routed on).
func (h *Handles) renewOwn(t Token, ttl time.Duration) (Handle, error) {
	if t.Issuer != h.cfg.DaemonID {
		return Handle{}, fmt.Errorf("%w: %q issued handle %d", ErrNotIssuer, t.Issuer, t.ID)
	}
	if err := h.checkTTL(ttl); err != nil {
		return Handle{}, err
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return Handle{}, ErrClosed
	}
	hd, err := h.ownLocked(t)
	if err != nil {
		h.stats.Refused++
		h.mu.Unlock()
		return Handle{}, err
	}
	h.mu.Unlock()
	// The pins first (outside the mutex: a cluster's pins are at other
	// daemons), so that they never end before the handle does: the new
	// expiry counts from before they were extended.
	start := h.cfg.Clock.Now()
	errExtend := hd.hold.Extend(ttl)
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.closed:
		return Handle{}, ErrClosed
	case h.live[t.ID] != hd:
		return Handle{}, fmt.Errorf("%w: handle %d ended while it was renewed", ErrExpired, t.ID)
	case errExtend != nil:
		return Handle{}, fmt.Errorf("renewing the pins of handle %d: %w", t.ID, errExtend)
	}
	hd.expiry = start.Add(ttl)
	hd.ver++
	h.sched.add(hd.expiry, t.ID, hd.ver)
	h.sched.tidy(len(h.live), h.current)
	h.stats.Renewed++
	h.cfg.Log.Debug("retention handle renewed", "handle", t.ID, "expiry", hd.expiry)
	return h.token(t.ID, hd), nil
}

// Release gives back the pins of the handle of token and says what the
// token names (its issuer, id and keys, for the caller's audit). Only the
// issuer releases: another daemon's token goes to Config.Router, or is
// refused with ErrNotIssuer. A handle released or expired already is
// ErrExpired.
func (h *Handles) Release(token []byte) (Token, error) {
	t, err := h.opened(token)
	if err != nil {
		return Token{}, err
	}
	if t.Issuer != h.cfg.DaemonID && h.cfg.Router != nil {
		return t, h.cfg.Router.Release(t, token)
	}
	return t, h.releaseOwn(t)
}

// releaseOwn releases a handle of this issuer: a token of another is
// ErrNotIssuer (a routed release is never routed on).
func (h *Handles) releaseOwn(t Token) error {
	if t.Issuer != h.cfg.DaemonID {
		return fmt.Errorf("%w: %q issued handle %d", ErrNotIssuer, t.Issuer, t.ID)
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return ErrClosed
	}
	hd, err := h.ownLocked(t)
	if err != nil {
		h.stats.Refused++
		h.mu.Unlock()
		return err
	}
	h.forget(t.ID, hd)
	h.sched.tidy(len(h.live), h.current)
	h.stats.Released++
	h.mu.Unlock()
	hd.hold.Release()
	h.cfg.Log.Debug("retention handle released", "handle", t.ID, "keys", hd.nkeys)
	return nil
}

// opened decodes and authenticates token, and checks its scope, counting
// a refusal.
func (h *Handles) opened(token []byte) (Token, error) {
	t, err := h.open(token)
	if err != nil {
		h.mu.Lock()
		h.stats.Refused++
		h.mu.Unlock()
	}
	return t, err
}

// current reports whether d is the deadline of a live handle. h.mu is
// held.
func (h *Handles) current(d deadline) bool {
	hd, ok := h.live[d.id]
	return ok && hd.ver == d.ver
}

// forget drops handle id from the table. h.mu is held; the caller
// releases its hold after unlocking.
func (h *Handles) forget(id uint64, hd *handle) {
	delete(h.live, id)
	h.keys -= hd.nkeys
}

// expire releases the handles whose time has come (the timer calls it).
func (h *Handles) expire() {
	var holds []Hold
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.sched.fired()
	now := h.cfg.Clock.Now()
	h.scratch = h.sched.due(now, h.scratch[:0])
	for _, d := range h.scratch {
		if hd, ok := h.live[d.id]; ok && hd.hold != nil && hd.ver == d.ver {
			h.forget(d.id, hd)
			h.stats.Expired++
			holds = append(holds, hd.hold)
			h.cfg.Log.Debug("retention handle expired", "handle", d.id, "keys", hd.nkeys)
		}
	}
	h.sched.arm()
	h.mu.Unlock()
	releaseAll(holds)
}

// Stats reports the counters.
func (h *Handles) Stats() HandleStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.stats
	s.Live, s.Keys = uint64(len(h.live)), uint64(h.keys)
	return s
}

// Close releases every handle's pins and refuses new calls. The daemon
// closes it before the store.
func (h *Handles) Close() {
	h.mu.Lock()
	h.closed = true
	h.sched.stop()
	var holds []Hold
	for id, hd := range h.live {
		if hd.hold != nil {
			holds = append(holds, hd.hold)
			h.forget(id, hd)
		}
	}
	h.mu.Unlock()
	releaseAll(holds)
}

// checkKeys checks a handle's or lease's key set.
func checkKeys(keys [][]byte, max int) error {
	if len(keys) == 0 {
		return fmt.Errorf("%w: no keys", ErrInvalid)
	}
	if len(keys) > max {
		return fmt.Errorf("%w: %d keys (at most %d)", ErrTooManyKeys, len(keys), max)
	}
	for i, k := range keys {
		if len(k) == 0 || len(k) > 65535 {
			return fmt.Errorf("%w: key %d of %d bytes", ErrInvalid, i, len(k))
		}
	}
	return nil
}
