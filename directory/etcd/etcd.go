// Package etcd is the multi-host backend of the directory: daemons register
// in etcd under leases they keep alive, publish their exports beside their
// registration, and serve lookups from a bounded-stale cache (see
// directory.Cache) that a watch of the same prefix keeps current.
//
// Layout under the prefix (default "/tensorcast/"):
//
//	members/<id>            a directory.Member, under the daemon's lease
//	exports/<id>/<name>     a directory.Export, under the same lease
//	claims/<id>             a daemon starting with the id (claim.go)
//	shards/<n>              the home of shard n of the store across hosts,
//	                        under its lease; the generation is the key's
//	                        mod revision (shards.go)
//
// A registration is created by a transaction on the key's create revision
// (it exists only if nobody holds the key), so two live daemons never hold
// one id: the second is refused, before its peer plane listens when it
// claimed the id first (Claim). A daemon that stops renewing its lease
// drops out when the lease lapses, its exports with it.
//
// What the directory says is advice (a route, not a permission): the
// owning peer's handshake and its tokens decide, and what they show
// corrects the cache. With etcd unreachable, sessions and the transfers on
// them go on; lookups are answered from the cache within the staleness
// budget and fail with directory.ErrUnavailable beyond it.
//
// Freshness costs etcd requests only when nothing else proves it. The
// cache is current as of the last watch response that carried everything
// up to its revision: an event, or a progress notification. The watch
// asks etcd for progress notifications of its own (etcd sends them every
// --experimental-watch-progress-notify-interval to an idle watch; they
// are no request), and the prober asks for one (a request) only when the
// cache is within Config.ProgressLead of its staleness budget and neither
// has come since. With etcd's interval below Budget - ProgressLead (1s for
// the defaults), a steady daemon asks for none; with etcd's default (10
// minutes) it asks about once every Budget - ProgressLead. The lease is
// renewed once every half TTL (the other half is left for the renewal to
// be tried again), not every third as etcd's client does.
//
// Goroutines and stop order. A Dir owns three goroutines: the feed (list,
// then watch, relist on a broken watch), the prober (progress requests on
// the watch when the cache needs one, and the outage check) and, after
// Join, the keeper (lease renewals, re-registration, the export
// catalog). Close cancels their context, waits for all three, revokes the
// lease (the registration and the exports disappear at once) and closes
// the client.
package etcd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/internal/ratelog"
)

// Defaults.
const (
	DefaultPrefix   = "/tensorcast/"
	DefaultBudget   = 2 * time.Second
	DefaultLeaseTTL = 10 * time.Second
	defaultDial     = 5 * time.Second
	defaultRetry    = 500 * time.Millisecond
	// maxStatusLeases bounds the lease reads one Status makes, and
	// statusLeaseWait the time they take in all.
	maxStatusLeases = 256
	statusLeaseWait = 2 * time.Second
	// listPageKeys bounds the keys one read of a listing asks etcd for:
	// a response stays a few megabytes (records are at most
	// directory.MaxRecord) and each read within DialTimeout, however many
	// daemons and exports the prefix holds.
	listPageKeys = 500
	// maxListKeys bounds the keys a listing takes in all: the most the
	// cache holds (members and exports), a claim per member and every
	// shard. A prefix holding more was written by something other than
	// daemons keeping to these bounds; its listing is refused (the
	// directory stays unprimed, and says why) rather than read in part.
	maxListKeys = 2*directory.MaxMembers + directory.MaxExports + maxShards
)

// Config configures a Dir.
type Config struct {
	// Endpoints are etcd's client URLs. Required.
	Endpoints []string
	// Prefix is where the directory lives in etcd; default DefaultPrefix.
	// It must start and end with '/'.
	Prefix string
	// CAFile, CertFile and KeyFile are the TLS files for https endpoints:
	// the CA that signs etcd's certificate, and this daemon's client
	// certificate and key (both or neither).
	CAFile, CertFile, KeyFile string
	// Budget is the staleness budget (default DefaultBudget).
	Budget time.Duration
	// LeaseTTL is the registration's lease, whole seconds (default
	// DefaultLeaseTTL).
	LeaseTTL time.Duration
	// DialTimeout bounds reaching etcd for Join and each read of a
	// listing (default 5s).
	DialTimeout time.Duration
	// JoinWait is how long Join waits for a previous holder of the id to
	// lapse before refusing (default LeaseTTL + 1s): a daemon restarted
	// after a crash waits for its old lease, a live holder renews its lease
	// and is never displaced.
	JoinWait time.Duration
	// ProgressLead is how close to the staleness budget the cache's proof
	// may come before the prober asks etcd for a progress notification,
	// when no event or notification came since (default Budget/4, at least
	// 10ms); it is also the least time between two such requests while
	// etcd does not answer.
	ProgressLead time.Duration
	// RetryEvery is the pause before a failed listing, registration or
	// catalog write is tried again (default 500ms).
	RetryEvery time.Duration
	// Clock measures ages against the budget (default time.Now).
	Clock directory.Clock
	// Self is this daemon's id; Static the peers its config names, kept
	// beside the registered members.
	Self   string
	Static []directory.Peer
	// Log defaults to discarding.
	Log *slog.Logger

	// listPage and listMax replace listPageKeys and maxListKeys (tests);
	// maxRecv, when set, is the client's limit on one response (tests: a
	// listing read in one response would pass it).
	listPage, listMax, maxRecv int
}

func (c *Config) setDefaults() error {
	bad := func(key string, v any, why string) error {
		return fmt.Errorf("%w: %s = %v: %s", directory.ErrConfig, key, v, why)
	}
	if len(c.Endpoints) == 0 {
		return bad("etcd_endpoints", "[]", "at least one endpoint is needed")
	}
	for _, e := range c.Endpoints {
		if !strings.HasPrefix(e, "http://") && !strings.HasPrefix(e, "https://") {
			return bad("etcd_endpoints", e, "must be an http:// or https:// URL")
		}
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if !strings.HasPrefix(c.Prefix, "/") || !strings.HasSuffix(c.Prefix, "/") || len(c.Prefix) > 128 {
		return bad("etcd_prefix", c.Prefix, "must start and end with '/' (at most 128 bytes)")
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return bad("etcd_cert_file", c.CertFile, "etcd_cert_file and etcd_key_file go together")
	}
	if c.Budget == 0 {
		c.Budget = DefaultBudget
	}
	if c.Budget < 0 {
		return bad("staleness_budget", c.Budget, "must be positive")
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.LeaseTTL < time.Second || c.LeaseTTL%time.Second != 0 {
		return bad("etcd_lease_ttl", c.LeaseTTL, "must be whole seconds, at least 1s")
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = defaultDial
	}
	if c.JoinWait <= 0 {
		c.JoinWait = c.LeaseTTL + time.Second
	}
	if c.ProgressLead <= 0 {
		c.ProgressLead = max(c.Budget/4, 10*time.Millisecond)
	}
	if c.ProgressLead >= c.Budget {
		c.ProgressLead = c.Budget / 2
	}
	if c.RetryEvery <= 0 {
		c.RetryEvery = defaultRetry
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.listPage <= 0 {
		c.listPage = listPageKeys
	}
	if c.listMax <= 0 {
		c.listMax = maxListKeys
	}
	return nil
}

// tlsConfig builds the client's TLS from the files; nil without any.
func (c *Config) tlsConfig() (*tls.Config, error) {
	if c.CAFile == "" && c.CertFile == "" {
		return nil, nil
	}
	t := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%w: etcd_ca_file = %q: %v", directory.ErrConfig, c.CAFile, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: etcd_ca_file = %q: no PEM certificate in it", directory.ErrConfig, c.CAFile)
		}
		t.RootCAs = pool
	}
	if c.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: etcd_cert_file = %q, etcd_key_file = %q: %v", directory.ErrConfig, c.CertFile, c.KeyFile, err)
		}
		t.Certificates = []tls.Certificate{cert}
	}
	return t, nil
}

// Dir is the etcd-backed directory of one daemon. It implements
// directory.Directory (the transports' address book) and
// directory.Reporter.
type Dir struct {
	cfg    Config
	log    *slog.Logger
	cli    *clientv3.Client
	cache  *directory.Cache
	static *directory.Embedded // this daemon, configured and observed peers

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// claimed is set by Claim, joined by a successful Join (the keeper
	// runs).
	claimed   atomic.Bool
	joined    atomic.Bool
	closeOnce sync.Once
	closed    atomic.Bool

	// curWatch is the watch in progress, for the prober (nil between
	// watches).
	curWatch atomic.Pointer[watchCtx]

	// requests counts the requests this directory sent to etcd
	// (keep-alives and progress requests included); progress and renewals
	// count those two kinds alone.
	requests, progress, renewals atomic.Uint64
	// notified counts the progress notifications the watch received (sent
	// by etcd on its own, or asked for).
	notified atomic.Uint64
	// leaseUntil is the least time, in unix nanoseconds by Config.Clock,
	// etcd holds the registration's lease without another renewal
	// (heldUntil); read on every fenced message (ShardsCurrent).
	leaseUntil atomic.Int64

	// smu guards the fields below.
	smu     sync.Mutex
	state   string
	since   time.Time
	outages uint64
	self    directory.Member
	// lease is the registration's lease, or before Join the claim's;
	// claimRev is the claim key's create revision while it is held, and
	// claimUntil the least time its lease is held (grant).
	lease      clientv3.LeaseID
	claimRev   int64
	claimUntil time.Time

	// pmu guards the catalog: what this daemon exports (desired) and what
	// is written under the current lease (applied, name → generation).
	pmu     sync.Mutex
	desired map[string]directory.Export
	applied map[string]uint64
	gen     uint64
	// kick wakes the keeper when desired changed (room for one).
	kick chan struct{}
	// shards are the shard claims of the store across hosts (shards.go).
	shards shardWatch
	// primed is closed once the cache has its first listing.
	primed     chan struct{}
	primedOnce sync.Once
	// refusedRecords and refusedClaims log the records skipped because
	// they do not decode, rate-limited: other daemons and operators write
	// them, and one bad record is read again on every listing and every
	// fallback lookup of its key. shut stops them.
	refusedRecords, refusedClaims *ratelog.Log
	// refusedListings logs the listings refused for their size (tried
	// again every RetryEvery, a read of one page each).
	refusedListings *ratelog.Log
}

var (
	_ directory.Directory = (*Dir)(nil)
	_ directory.Reporter  = (*Dir)(nil)
	_ directory.Store     = (*store)(nil)
)

// Open connects to etcd and starts the feed: the cache loads a listing of
// the prefix and follows it. It does not register this daemon (Join does)
// and does not wait for etcd: until the first listing, every lookup falls
// back.
func Open(cfg Config) (*Dir, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	tc, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	static, err := directory.NewEmbedded(directory.Peer{ID: cfg.Self}, cfg.Static)
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            cfg.Endpoints,
		DialTimeout:          cfg.DialTimeout,
		DialKeepAliveTime:    cfg.LeaseTTL,
		DialKeepAliveTimeout: cfg.DialTimeout,
		TLS:                  tc,
		Logger:               zap.NewNop(),
		AutoSyncInterval:     0,
		MaxCallRecvMsgSize:   cfg.maxRecv,
		// gRPC's default reconnect backoff grows to two minutes: a daemon
		// would find etcd back long after its lease's TTL, and so lose a
		// registration etcd's restart renewed (keeper, resume). Retry at
		// least three times a TTL, with jitter.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{BaseDelay: min(100*time.Millisecond, cfg.LeaseTTL/3), Multiplier: 1.6, Jitter: 0.2,
				MaxDelay: cfg.LeaseTTL / 3},
			MinConnectTimeout: cfg.DialTimeout,
		})},
	})
	if err != nil {
		return nil, fmt.Errorf("%w: etcd_endpoints = %v: %v", directory.ErrConfig, cfg.Endpoints, err)
	}
	d := &Dir{cfg: cfg, log: cfg.Log.With("component", "directory", "backend", "etcd"), cli: cli, static: static,
		state: "connecting", since: cfg.Clock(), desired: make(map[string]directory.Export),
		applied: make(map[string]uint64), kick: make(chan struct{}, 1), primed: make(chan struct{})}
	d.refusedRecords = ratelog.New(d.log, slog.LevelWarn, "directory record refused", 0)
	d.refusedClaims = ratelog.New(d.log, slog.LevelWarn, "shard claim refused", 0)
	d.refusedListings = ratelog.New(d.log, slog.LevelError,
		"directory listing refused: the prefix holds more keys than a daemon lists; until it is cleaned up the cache is neither loaded nor followed (lookups read etcd or fail, as their lane says) and this daemon is home of no shard", 0)
	d.cache, err = directory.NewCache(directory.CacheConfig{Budget: cfg.Budget, Store: &store{d}, Clock: cfg.Clock,
		RefreshTimeout: min(cfg.Budget, cfg.DialTimeout)})
	if err != nil {
		cli.Close()
		return nil, err
	}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	d.wg.Add(2)
	go d.feed()
	go d.prober()
	d.log.Info("directory opened", "endpoints", cfg.Endpoints, "prefix", cfg.Prefix, "staleness_budget", cfg.Budget.String(),
		"lease_ttl", cfg.LeaseTTL.String(), "tls", tc != nil)
	return d, nil
}

// Cache is the directory's cache (lookups, corrections, counters).
func (d *Dir) Cache() *directory.Cache { return d.cache }

func (d *Dir) memberKey(id string) string { return d.cfg.Prefix + "members/" + id }
func (d *Dir) exportKey(owner, name string) string {
	return d.cfg.Prefix + "exports/" + owner + "/" + name
}

// parse turns a key and value of the prefix into a cache event; ok is
// false for a key outside the layout or a record that does not decode (or
// does not match its key), which is logged and skipped.
func (d *Dir) parse(key, val []byte, del bool, lease, rev int64) (directory.Event, bool) {
	k, found := strings.CutPrefix(string(key), d.cfg.Prefix)
	if !found {
		return directory.Event{}, false
	}
	ev := directory.Event{Delete: del, Lease: lease, Rev: rev}
	switch {
	case strings.HasPrefix(k, "members/"):
		id := k[len("members/"):]
		if del {
			ev.Member = &directory.Member{ID: id}
			return ev, true
		}
		m, err := directory.DecodeMember(val)
		if err == nil && m.ID != id {
			err = fmt.Errorf("record names %q", m.ID)
		}
		if err != nil {
			d.refusedRecords.Event(slog.String("key", string(key)), slog.Any("err", err))
			// What cannot be read is not believed: the entry goes.
			ev.Delete, ev.Member = true, &directory.Member{ID: id}
			return ev, true
		}
		ev.Member = &m
		return ev, true
	case strings.HasPrefix(k, "exports/"):
		owner, name, ok := strings.Cut(k[len("exports/"):], "/")
		if !ok {
			return directory.Event{}, false
		}
		if del {
			ev.Export = &directory.Export{Owner: owner, Name: name}
			return ev, true
		}
		e, err := directory.DecodeExport(val)
		if err == nil && (e.Owner != owner || e.Name != name) {
			err = fmt.Errorf("record names %q", e.Key())
		}
		if err != nil {
			d.refusedRecords.Event(slog.String("key", string(key)), slog.Any("err", err))
			ev.Delete, ev.Export = true, &directory.Export{Owner: owner, Name: name}
			return ev, true
		}
		ev.Export = &e
		return ev, true
	}
	return directory.Event{}, false
}

// wait pauses for d or until the directory closes; false when it closed.
func (d *Dir) wait(dur time.Duration) bool {
	t := time.NewTimer(dur)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-d.ctx.Done():
		return false
	}
}

// feed keeps the cache current: a listing, then a watch from the
// listing's revision; a broken watch (compacted, canceled, no leader)
// starts over with a new listing.
func (d *Dir) feed() {
	defer d.wg.Done()
	for d.ctx.Err() == nil {
		rev, err := d.list()
		if err != nil {
			if errors.Is(err, errListTooLarge) {
				d.refusedListings.Event(slog.Any("err", err))
			} else {
				d.log.Debug("directory listing failed", "err", err)
			}
			if !d.wait(d.cfg.RetryEvery) {
				return
			}
			continue
		}
		d.watch(rev)
	}
}

func (d *Dir) list() (int64, error) {
	var evs []directory.Event
	var claims []ShardClaim
	rev, err := d.listPages(func(kvs []*mvccpb.KeyValue) {
		for _, kv := range kvs {
			if sh, ok := d.shardOf(kv.Key); ok {
				claims = append(claims, d.shardClaimOf(sh, kv.Value, kv.ModRevision))
				continue
			}
			if ev, ok := d.parse(kv.Key, kv.Value, false, kv.Lease, kv.ModRevision); ok && !ev.Delete {
				evs = append(evs, ev)
			}
		}
	})
	if err != nil {
		return 0, err
	}
	d.cache.Load(evs, rev)
	d.listedShards(claims, rev)
	d.primedOnce.Do(func() { close(d.primed) })
	d.reachable()
	return rev, nil
}

// errListTooLarge refuses a listing of more keys than Config.listMax.
var errListTooLarge = errors.New("too many keys to list")

// listPages reads the prefix in pages of at most Config.listPage keys,
// each read within DialTimeout, and hands each page to take. Every page
// is read at the revision of the first, which it returns: the listing is
// the prefix as of that revision, and a watch from the next one misses
// nothing. A revision compacted before the last page fails the listing
// (it is tried again, at a new revision). A prefix of more than
// Config.listMax keys is refused after its first page (which says how
// many there are), with errListTooLarge.
func (d *Dir) listPages(take func([]*mvccpb.KeyValue)) (int64, error) {
	end := clientv3.GetPrefixRangeEnd(d.cfg.Prefix)
	from, rev, taken := d.cfg.Prefix, int64(0), 0
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(int64(d.cfg.listPage))}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		ctx, cancel := context.WithTimeout(d.ctx, d.cfg.DialTimeout)
		d.requests.Add(1)
		resp, err := d.cli.Get(ctx, from, opts...)
		cancel()
		if err != nil {
			return 0, err
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		// Count is every key of the range at rev, whatever the limit.
		if total := max(resp.Count, int64(taken+len(resp.Kvs))); total > int64(d.cfg.listMax) {
			return 0, fmt.Errorf("%w: %s holds %d keys at revision %d, more than the %d a listing takes",
				errListTooLarge, d.cfg.Prefix, total, rev, d.cfg.listMax)
		}
		take(resp.Kvs)
		taken += len(resp.Kvs)
		if !resp.More || len(resp.Kvs) == 0 {
			return rev, nil
		}
		// The next page starts just past this one's last key.
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// caughtUp says whether a watch response of n events, the last at
// revision last, carries everything up to its header revision hdr.
func caughtUp(n int, last, hdr int64) bool { return n == 0 || last >= hdr }

// watchCtx is the context of the current watch: progress requests must be
// sent on the watch's own stream.
type watchCtx struct{ ctx context.Context }

func (d *Dir) watch(rev int64) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(d.ctx))
	defer cancel()
	d.curWatch.Store(&watchCtx{wctx})
	defer d.curWatch.Store(nil)
	// WithProgressNotify: etcd proves an idle watch current by itself,
	// at its own interval, without a request.
	wch := d.cli.Watch(wctx, d.cfg.Prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithProgressNotify())
	for resp := range wch {
		if err := resp.Err(); err != nil {
			d.log.Info("directory watch ended; listing again", "err", err)
			return
		}
		last := int64(0)
		var claims []ShardClaim
		for _, e := range resp.Events {
			del := e.Type == mvccpb.DELETE
			if sh, ok := d.shardOf(e.Kv.Key); ok {
				c := ShardClaim{Shard: sh, Gen: uint64(e.Kv.ModRevision)}
				if !del {
					c = d.shardClaimOf(sh, e.Kv.Value, e.Kv.ModRevision)
				}
				claims = append(claims, c)
				last = e.Kv.ModRevision
				continue
			}
			if ev, ok := d.parse(e.Kv.Key, e.Kv.Value, del, e.Kv.Lease, e.Kv.ModRevision); ok {
				d.cache.Apply(ev)
			}
			last = e.Kv.ModRevision
		}
		d.shardEvents(claims)
		if len(resp.Events) == 0 && resp.IsProgressNotify() {
			d.notified.Add(1)
		}
		// A watch that is catching up (it started far behind, or fell
		// behind) gets its events in batches whose header is etcd's
		// current revision, with more still to come: such a batch proves
		// the cache current only up to its last event, which Apply has
		// recorded. Only a response that carries everything up to its
		// header (a live event, or a progress notification, which etcd
		// sends only to a watch that has caught up) refreshes the cache's
		// age.
		// Only then is the directory up again: a catch-up batch says etcd
		// answers, not that the cache is current, and calling that up
		// would let the prober find the cache still past its budget and
		// declare a second outage within the same recovery.
		if caughtUp(len(resp.Events), last, resp.Header.Revision) {
			d.cache.Synced(resp.Header.Revision)
			d.reachable()
		}
	}
}

// prober looks, twice every ProgressLead, at how old the cache's proof
// is: it checks for an outage, and asks etcd to prove the watch current
// (a progress notification is a watch response, and so refreshes the
// cache's age) only when the proof is within ProgressLead of the budget,
// which means that no event and no notification came for Budget -
// ProgressLead, and it did not ask within the last ProgressLead.
func (d *Dir) prober() {
	defer d.wg.Done()
	t := time.NewTicker(max(d.cfg.ProgressLead/2, 5*time.Millisecond))
	defer t.Stop()
	// asked is when the last request went, by the real clock: it spaces
	// requests, whatever clock measures the cache's age.
	var asked time.Time
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-t.C:
		}
		d.checkOutage()
		w := d.curWatch.Load()
		if w == nil {
			continue
		}
		now := time.Now()
		if !needProgress(d.cache.Age(), d.cfg.Budget, d.cfg.ProgressLead, now.Sub(asked), !asked.IsZero()) {
			continue
		}
		asked = now
		pctx, cancel := context.WithTimeout(w.ctx, d.cfg.ProgressLead)
		d.requests.Add(1)
		d.progress.Add(1)
		_ = d.cli.RequestProgress(pctx)
		cancel()
	}
}

// needProgress says whether the prober asks for a progress notification:
// the cache's proof (age old) is within lead of the budget, and the last
// request (since ago, when there was one) is not within lead.
func needProgress(age, budget, lead, since time.Duration, askedBefore bool) bool {
	if age < budget-lead {
		return false
	}
	return !askedBefore || since >= lead || since < 0
}

// checkOutage moves the state to down, logging it once, when the cache
// has not been proved current for longer than the budget (or, before the
// first listing, when the directory has been open for longer than it).
func (d *Dir) checkOutage() {
	age := d.cache.Age()
	if age <= d.cfg.Budget {
		return
	}
	d.smu.Lock()
	defer d.smu.Unlock()
	if d.state == directory.StateDown || d.state == directory.StateClosed {
		return
	}
	// The first listing has the budget to come: before it, the cache's
	// age is "never", and calling that an outage would log one, and a
	// recovery, at nearly every start.
	if d.state == "connecting" && d.cfg.Clock().Sub(d.since) <= d.cfg.Budget {
		return
	}
	// Read again under smu: the feed refreshes the cache before it calls
	// reachable (which takes smu), so an age read before the lock may be
	// from before a recovery that has since been declared; acting on it
	// would declare a second outage within that recovery.
	if age = d.cache.Age(); age <= d.cfg.Budget {
		return
	}
	if d.state == directory.StateUp {
		d.outages++
	}
	prev := d.state
	d.state, d.since = directory.StateDown, d.cfg.Clock()
	what := "unreachable"
	if prev == "connecting" {
		what = "not reached yet"
	}
	d.log.Warn("etcd "+what+": lookups older than the staleness budget fail UNAVAILABLE until it answers; sessions and transfers go on",
		"endpoints", d.cfg.Endpoints, "cache_age", fmtAge(age), "staleness_budget", d.cfg.Budget.String())
}

// reachable records that etcd answered; after an outage it logs, once,
// that the directory recovered.
func (d *Dir) reachable() {
	d.smu.Lock()
	defer d.smu.Unlock()
	switch d.state {
	case directory.StateUp, directory.StateClosed, directory.StateConflict:
		return
	case directory.StateDown:
		d.log.Info("etcd reachable again: the directory cache is current", "down_for",
			d.cfg.Clock().Sub(d.since).Round(time.Millisecond).String())
	}
	d.state, d.since = directory.StateUp, d.cfg.Clock()
}

func fmtAge(a time.Duration) string {
	if a == directory.Never {
		return "never"
	}
	return a.Round(time.Millisecond).String()
}

// State is the backend's state (directory.StateUp, StateDown, ...).
func (d *Dir) State() string {
	d.smu.Lock()
	defer d.smu.Unlock()
	return d.state
}

// Requests counts the requests sent to etcd so far.
func (d *Dir) Requests() uint64 { return d.requests.Load() }

// ProgressRequests and Renewals count the requests of those two kinds
// (the directory's timed ones) among Requests.
func (d *Dir) ProgressRequests() uint64 { return d.progress.Load() }
func (d *Dir) Renewals() uint64         { return d.renewals.Load() }

// store is the Dir as the cache's fallback Store.
type store struct{ d *Dir }

// errDown is the store's answer while the directory knows etcd is down:
// the lookup fails closed at once rather than waiting out a read that the
// feed has been failing at for longer than the budget (the feed and the
// prober notice when etcd is back).
func (d *Dir) errDown() error {
	d.smu.Lock()
	defer d.smu.Unlock()
	if d.state != directory.StateDown {
		return nil
	}
	return fmt.Errorf("etcd has not answered since %s", d.since.UTC().Format(time.RFC3339))
}

// GetMember reads id's registration; the read's revision is the
// response header's (the store's revision the read was served at), so
// that the cache can tell it from what its watch delivered since.
func (s *store) GetMember(ctx context.Context, id string) (directory.MemberRead, error) {
	d := s.d
	if err := d.errDown(); err != nil {
		return directory.MemberRead{}, err
	}
	d.requests.Add(1)
	resp, err := d.cli.Get(clientv3.WithRequireLeader(ctx), d.memberKey(id))
	if err != nil {
		return directory.MemberRead{}, err
	}
	r := directory.MemberRead{At: resp.Header.Revision}
	if len(resp.Kvs) == 0 {
		return r, nil
	}
	kv := resp.Kvs[0]
	if ev, ok := d.parse(kv.Key, kv.Value, false, kv.Lease, kv.ModRevision); ok && !ev.Delete {
		r.Found, r.Member, r.Lease, r.Rev = true, *ev.Member, kv.Lease, kv.ModRevision
	}
	return r, nil
}

// GetExport reads the catalog entry owner/name, like GetMember.
func (s *store) GetExport(ctx context.Context, owner, name string) (directory.ExportRead, error) {
	d := s.d
	if err := d.errDown(); err != nil {
		return directory.ExportRead{}, err
	}
	d.requests.Add(1)
	resp, err := d.cli.Get(clientv3.WithRequireLeader(ctx), d.exportKey(owner, name))
	if err != nil {
		return directory.ExportRead{}, err
	}
	r := directory.ExportRead{At: resp.Header.Revision}
	if len(resp.Kvs) == 0 {
		return r, nil
	}
	kv := resp.Kvs[0]
	if ev, ok := d.parse(kv.Key, kv.Value, false, kv.Lease, kv.ModRevision); ok && !ev.Delete {
		r.Found, r.Export, r.Rev = true, *ev.Export, kv.ModRevision
	}
	return r, nil
}

// Close leaves the directory: it stops the goroutines, revokes the lease
// (this daemon's registration and exports disappear at once; not tried
// while etcd is known down, when the lease lapses with its TTL) and closes
// the client. Safe to call more than once.
func (d *Dir) Close() error {
	d.shut(true)
	return nil
}

// Abandon stops as a crash would: the goroutines stop and the client
// closes, but the lease is not revoked, so the registration lapses only
// when its TTL runs out. For tests and the churn harness.
func (d *Dir) Abandon() { d.shut(false) }

func (d *Dir) shut(revoke bool) {
	d.closeOnce.Do(func() {
		d.closed.Store(true)
		d.cancel()
		d.wg.Wait()
		d.refusedRecords.Stop()
		d.refusedClaims.Stop()
		d.refusedListings.Stop()
		d.smu.Lock()
		lease, down := d.lease, d.state == directory.StateDown
		d.state, d.since = directory.StateClosed, d.cfg.Clock()
		d.smu.Unlock()
		if revoke && lease != 0 && down {
			// A revoke would wait out its timeout on an etcd that has
			// not answered for longer than the budget.
			d.log.Warn("etcd is unreachable: the directory lease is not revoked and lapses with its TTL",
				"lease_ttl", d.cfg.LeaseTTL.String())
			revoke = false
		}
		if revoke && lease != 0 {
			// Bounded: with etcd unreachable the lease lapses by itself.
			ctx, cancel := context.WithTimeout(context.Background(), min(d.cfg.DialTimeout, time.Second))
			d.requests.Add(1)
			if _, err := d.cli.Revoke(ctx, lease); err != nil {
				d.log.Warn("could not revoke the directory lease; the registration lapses with its TTL",
					"lease_ttl", d.cfg.LeaseTTL.String(), "err", err)
			} else {
				d.log.Info("left the directory")
			}
			cancel()
		}
		if err := d.cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
			d.log.Debug("closing the etcd client", "err", err)
		}
	})
}
