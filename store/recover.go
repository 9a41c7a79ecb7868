package store

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"syscall"

	"github.com/tensorcast/tensorcast/xfer"
)

// Recovery rebuilds the index and the L2 allocation map from the file
// itself: the superblock gives the geometry, each region header its slot
// size, each block header a key. Nothing else is read or trusted, so there
// is nothing that can disagree with the blocks. Blank, foreign, stale
// (another nonce) and damaged headers leave their slot free; damaged ones
// are counted as torn. Two valid blocks of one key (an older one whose
// zeroing failed after a put of the key superseded it, or tampering) keep
// the higher sequence number; the other is zeroed, or, when that fails,
// kept out of use and zeroed before any invalidation of the key
// (tier2.ghosts). A header the device cannot read (a bad sector) is
// counted as torn too, but its slot, or its whole region, is kept out
// of use instead: what it holds may be an acknowledged value that a later
// restart can read.

const defaultRegionSize = 64 << 20

// maxRegions bounds the regions of an L2 file. The region size comes from
// the superblock, outside input: a small one over a large file would have
// recovery keep a region record for every few sectors and read each
// region's header, gigabytes of memory and hours of reads before the
// first call. The default region size never comes near it: a file of 2^20
// regions of 64 MiB has more slots than slot ids (setGeometry).
const maxRegions = 1 << 20

// runSync dispatches kSync tasks and waits for all of them. It returns the
// first failure.
func (t *tier2) runSync(its []*ioTask, xts *[]*xfer.Task) error {
	for _, it := range its {
		it.kind, it.syncErr = kSync, nil
	}
	t.syncWG.Add(len(its))
	t.submit(its, xts)
	t.syncWG.Wait()
	for _, it := range its {
		if it.syncErr != nil {
			return it.syncErr
		}
	}
	return nil
}

// runReads is runSync for the scan's reads: a read the device failed for
// its sector alone (readLost) is left in its task for the caller to skip;
// any other failure (the transport's) is returned.
func (t *tier2) runReads(its []*ioTask, xts *[]*xfer.Task) error {
	t.runSync(its, xts)
	for _, it := range its {
		if it.syncErr != nil && !readLost(it) {
			return it.syncErr
		}
	}
	return nil
}

// readLost reports whether the recovery read it failed on the device for
// its own sectors: dispatched, and ended with the errno of a medium error
// (EIO; ENODATA, an unrecovered read; EILSEQ, a failed integrity check).
// One bad sector then costs the block or region it holds, not the whole
// L2: recovery used to fail, and the daemon not start.
func readLost(it *ioTask) bool {
	err := it.syncErr
	return err != nil && !it.xt.Undispatched() &&
		(errors.Is(err, syscall.EIO) || errors.Is(err, syscall.ENODATA) || errors.Is(err, syscall.EILSEQ))
}

// lost counts and logs (rarely) a header sector recovery could not read.
func (t *tier2) lost(what string, off uint64, err error) {
	t.s.c.torn.Add(1)
	t.s.rare(&t.s.c.unreadable, "store: an L2 header could not be read at start-up; what it describes is kept out of use",
		"header", what, "offset", off, "err", err)
}

// takeAll takes up to n tasks (recovery owns the whole table).
func (t *tier2) takeAll(n int, dst []*ioTask) []*ioTask {
	dst = dst[:0]
	for len(dst) < n {
		it := t.getTask(false)
		if it == nil {
			break
		}
		dst = append(dst, it)
	}
	return dst
}

func (t *tier2) freeAll(its []*ioTask) {
	for _, it := range its {
		t.freeTask(it)
	}
}

func (t *tier2) recover() error {
	s := t.s
	a := t.g.align
	var xts []*xfer.Task
	its := t.takeAll(len(t.tasks), nil)
	defer func() { t.freeAll(its) }()
	if t.file.Size() < 2*a {
		return fmt.Errorf("%w: L2 file of %d bytes", ErrConfig, t.file.Size())
	}

	// The superblock.
	sb := its[:1]
	t.reqSector(sb[0], xfer.OpRead, 0, false)
	if err := t.runSync(sb, &xts); err != nil {
		return fmt.Errorf("store: read the L2 superblock: %w", err)
	}
	h, err := decodeHeader(t.sector(sb[0]), magicSuper)
	formatted := false
	inUse := uint64(0) // the regions the file was last opened with (the superblock's seq)
	switch {
	case errors.Is(err, errBlank):
		if err := t.format(sb, &xts); err != nil {
			return err
		}
		formatted = true
	case err != nil:
		return fmt.Errorf("%w: the first sector of the L2 file is not a tensorcast superblock (%v); refusing to overwrite it", ErrL2Format, err)
	default:
		if uint64(h.units) != a {
			return fmt.Errorf("%w: L2 file formatted with Align=%d, this store uses %d (set L2.Align)", ErrConfig, h.units, a)
		}
		t.g.regionSize, t.fileNonce, inUse = h.offset, h.nonce, h.seq
	}
	if err := t.setGeometry(); err != nil {
		if !formatted {
			return fmt.Errorf("store: the L2 file's superblock sets region size %d: %w", t.g.regionSize, err)
		}
		return err
	}
	t.initRegions()
	if formatted {
		s.log.Info("store: formatted an empty L2 file", "size", t.file.Size(), "align", a,
			"region_size", t.g.regionSize, "regions", t.g.nregions)
		return nil
	}
	if err := t.resized(inUse, its, &xts); err != nil {
		return err
	}

	// Region headers.
	var maxSeq uint64
	for r0 := 0; r0 < t.g.nregions; r0 += len(its) {
		batch := its[:min(len(its), t.g.nregions-r0)]
		for i, it := range batch {
			t.reqSector(it, xfer.OpRead, t.g.regionOff(int32(r0+i)), false)
		}
		if err := t.runReads(batch, &xts); err != nil {
			return fmt.Errorf("store: read L2 region headers: %w", err)
		}
		for i, it := range batch {
			ri := int32(r0 + i)
			if it.syncErr != nil {
				t.regions[ri].state = regLost
				t.capacity -= t.g.regionSize - a
				t.lost("region", t.g.regionOff(ri), it.syncErr)
				continue
			}
			t.adoptRegion(ri, t.sector(it))
		}
	}
	t.freeRegions = t.freeRegions[:0]
	for ri := t.g.nregions - 1; ri >= 0; ri-- {
		if t.regions[ri].state == regFree {
			t.freeRegions = append(t.freeRegions, int32(ri))
		}
	}

	// Block headers, region by region.
	var stale []staleSlot // slots to zero: losers of a duplicate key, blocks failing verification
	type slotPos struct {
		r int32
		j uint32
	}
	pos := make([]slotPos, 0, len(its))
	flush := func() error {
		batch := its[:len(pos)]
		for i, it := range batch {
			r := pos[i].r
			t.reqSector(it, xfer.OpRead, t.g.slotOff(r, int(t.regions[r].class), pos[i].j), false)
		}
		if err := t.runReads(batch, &xts); err != nil {
			return fmt.Errorf("store: read L2 block headers: %w", err)
		}
		for i, it := range batch {
			if it.syncErr != nil {
				t.loseSlot(pos[i].r, pos[i].j, it.syncErr)
				continue
			}
			seq, loser := t.adoptBlock(pos[i].r, pos[i].j, t.sector(it))
			maxSeq = max(maxSeq, seq)
			if loser != noSlot {
				h, _ := decodeHeader(t.sector(it), magicBlock) // valid: adopted, or the loser itself
				stale = append(stale, staleSlot{loser, string(h.key)})
			}
		}
		pos = pos[:0]
		return nil
	}
	for ri := range t.regions {
		r := &t.regions[ri]
		if r.state != regOpen {
			continue
		}
		for j := uint32(0); j < t.classes[r.class].per; j++ {
			pos = append(pos, slotPos{int32(ri), j})
			if len(pos) == len(its) {
				if err := flush(); err != nil {
					return err
				}
			}
		}
	}
	if len(pos) > 0 {
		if err := flush(); err != nil {
			return err
		}
	}
	t.seq.Store(maxSeq)

	if t.cfg.VerifyOnOpen {
		bad, err := t.verifyAll(its, &xts)
		if err != nil {
			return err
		}
		stale = append(stale, bad...)
	}
	t.settleRegions()
	if err := t.zeroStale(stale, its, &xts); err != nil {
		return err
	}
	// l1 carried each entry's sequence number during the scan.
	for i := range s.shards {
		sh := &s.shards[i]
		for idx := uint32(0); idx < sh.nents; idx++ {
			sh.ent(idx).l1 = 0
		}
	}
	return nil
}

const noSlot = ^uint32(0)

// format writes the superblock of an empty file.
func (t *tier2) format(sb []*ioTask, xts *[]*xfer.Task) error {
	r := t.cfg.RegionSize
	if r == 0 {
		r = defaultRegionSize
		if need := 2 * (t.g.align + t.g.slotSize(t.g.classOf(t.s.maxBlock))); r < need {
			r = need
		}
		// A file smaller than a default region still gets one.
		if fit := (t.file.Size() - t.g.align) / t.g.align * t.g.align; r > fit {
			r = fit
		}
	}
	t.g.regionSize = r / t.g.align * t.g.align
	t.fileNonce = rand.Uint64() | 1
	if err := t.setGeometry(); err != nil {
		return err
	}
	return t.writeSuper(sb, xts)
}

// writeSuper writes the superblock, with the file's current region count.
func (t *tier2) writeSuper(sb []*ioTask, xts *[]*xfer.Task) error {
	encodeHeader(t.sector(sb[0]), &header{magic: magicSuper, units: uint32(t.g.align), seq: uint64(t.g.nregions),
		nonce: t.fileNonce, offset: t.g.regionSize})
	t.reqSector(sb[0], xfer.OpWrite, 0, false)
	if err := t.runSync(sb, xts); err != nil {
		return fmt.Errorf("store: write the L2 superblock: %w", err)
	}
	return nil
}

// resized deals with an L2 whose region count is not the one recorded
// when it was last opened (the superblock's seq). Regions past a smaller size are
// not read, and removals while they are cut off write nothing there: the
// blocks in them must never count again. So a smaller count is recorded
// before the store serves anything, and when the L2 grows past the count
// recorded, the region headers past it are zeroed (their blocks then
// belong to no region) before the new count is. A crash between the two
// zeroes them again at the next start. A superblock of a file formatted
// before the count was kept (its seq is its nonce) gets it now.
func (t *tier2) resized(recorded uint64, its []*ioTask, xts *[]*xfer.Task) error {
	n := uint64(t.g.nregions)
	if recorded == n {
		return nil
	}
	inUse := recorded
	if recorded == t.fileNonce || recorded > maxRegions {
		inUse = n // not recorded: nothing to go by
	}
	for r0 := inUse; r0 < n; r0 += uint64(len(its)) {
		batch := its[:min(uint64(len(its)), n-r0)]
		for i, it := range batch {
			t.reqSector(it, xfer.OpWrite, t.g.regionOff(int32(r0+uint64(i))), true)
		}
		if err := t.runSync(batch, xts); err != nil {
			return fmt.Errorf("store: zero the L2 regions past its earlier size: %w", err)
		}
	}
	t.s.log.Info("store: the L2 holds another number of regions than when it was last opened; recorded",
		"regions", n, "before", recorded)
	return t.writeSuper(its[:1], xts)
}

// setGeometry derives the slot classes and region count from the region
// size and the file size.
func (t *tier2) setGeometry() error {
	g := &t.g
	a := g.align
	if g.regionSize < 3*a || g.regionSize%a != 0 {
		return fmt.Errorf("%w: L2 region size %d (want a multiple of %d, at least %d)", ErrConfig, g.regionSize, a, 3*a)
	}
	maxc := g.classOf(t.s.maxBlock)
	g.nclasses = 0
	for c := 0; c <= maxc && a+g.slotSize(c) <= g.regionSize; c++ {
		g.nclasses = c + 1
	}
	if need := g.classOf(t.s.cfg.MaxValueSize); need >= g.nclasses {
		return fmt.Errorf("%w: L2 regions of %d bytes cannot hold values of %d bytes (MaxValueSize); use a larger RegionSize or a smaller MaxValueSize",
			ErrConfig, g.regionSize, t.s.cfg.MaxValueSize)
	}
	nregions := (t.file.Size() - a) / g.regionSize
	switch {
	case nregions < 1:
		return fmt.Errorf("%w: L2 file of %d bytes holds no region of %d bytes", ErrConfig, t.file.Size(), g.regionSize)
	case nregions > maxRegions:
		return fmt.Errorf("%w: L2 file of %d bytes holds %d regions of %d bytes, more than %d",
			ErrConfig, t.file.Size(), nregions, g.regionSize, maxRegions)
	}
	g.nregions = int(nregions)
	g.perMax = uint32((g.regionSize - a) / g.slotSize(0))
	if uint64(g.nregions)*uint64(g.perMax) >= 1<<32 {
		return fmt.Errorf("%w: L2 file of %d bytes has too many slots for region size %d; use a larger RegionSize",
			ErrConfig, t.file.Size(), g.regionSize)
	}
	return nil
}

// adoptRegion takes region ri's header sector into the allocator.
func (t *tier2) adoptRegion(ri int32, sector []byte) {
	s := t.s
	h, err := decodeHeader(sector, magicRegion)
	switch {
	case errors.Is(err, errBlank):
		return
	case errors.Is(err, errForeign):
		s.c.foreign.Add(1)
		return
	case err != nil:
		s.c.torn.Add(1)
		return
	}
	if h.seq != t.fileNonce {
		return // left over from an earlier format of the file
	}
	c := -1
	for k := 0; k < t.g.nclasses; k++ {
		if t.classes[k].units == uint64(h.units) {
			c = k
		}
	}
	if c < 0 || h.offset != t.g.regionOff(ri) || h.nonce == 0 {
		s.c.torn.Add(1)
		return
	}
	t.assign(ri, c, regOpen, h.nonce)
	t.regions[ri].bump = t.classes[c].per
}

// adoptBlock takes slot j of region ri into the index, if its header
// sector holds a valid block. It returns the block's sequence number and,
// when two blocks claim one key, the slot of the older one, which is to be
// zeroed (it is marked staleOwner until then).
func (t *tier2) adoptBlock(ri int32, j uint32, sector []byte) (uint64, uint32) {
	s := t.s
	r := &t.regions[ri]
	c := int(r.class)
	h, err := decodeHeader(sector, magicBlock)
	switch {
	case errors.Is(err, errBlank), errors.Is(err, errForeign):
		return 0, noSlot
	case err != nil:
		s.c.torn.Add(1)
		return 0, noSlot
	}
	if h.nonce != r.nonce {
		return 0, noSlot // from an earlier use of the region
	}
	if h.seq == 0 || h.seq >= seqLimit ||
		h.offset != t.g.slotOff(ri, c, j) || uint64(h.units) != t.classes[c].units || h.valueLen == 0 ||
		h.valueLen > t.g.align<<c || h.valueLen > t.s.maxBlock || len(h.key) > s.cfg.MaxKeyLen {
		s.c.torn.Add(1)
		return 0, noSlot
	}
	slot := t.slotID(ri, j)
	hh, sh, si := s.hash(h.key)
	idx, dup := sh.find(hh, h.key)
	loser := noSlot
	if dup {
		s.c.dups.Add(1)
		e := sh.ent(idx)
		if e.l1 >= h.seq { // the entry's block is newer: this one goes
			r.owner[j] = staleOwner
			return h.seq, slot
		}
		loser = e.l2
		lr, lc, lj, _ := t.slotAt(loser)
		t.regions[lr].owner[lj] = staleOwner
		t.regions[lr].live--
		t.used -= t.g.slotSize(lc)
	} else {
		idx = sh.insert(hh, h.key, stReady)
		sh.ent(idx).flags = fL2
		sh.l2Touch(idx)
		s.c.keys.Add(1)
		s.c.l2Keys.Add(1)
		s.c.recovered.Add(1)
	}
	e := sh.ent(idx)
	// l1 carries the block's sequence number until the scan is over.
	e.l2, e.size, e.crc, e.l1 = slot, uint32(h.valueLen), h.valueCRC, h.seq
	r.owner[j] = ref{si, idx, e.gen}.packed()
	r.live++
	t.used += t.g.slotSize(c)
	return h.seq, loser
}

// loseSlot keeps slot j of region ri, whose header could not be read, out
// of use for good, and its region with it (the slot counts as live).
func (t *tier2) loseSlot(ri int32, j uint32, err error) {
	r := &t.regions[ri]
	r.owner[j] = quarOwner
	r.live++
	r.stuck++
	t.used += t.g.slotSize(int(r.class))
	t.quarantined++
	t.lost("block", t.g.slotOff(ri, int(r.class), j), err)
}

// settleRegions rebuilds each open region's free-slot stack from its
// owners, after the scan.
func (t *tier2) settleRegions() {
	for ri := range t.regions {
		r := &t.regions[ri]
		if r.state != regOpen {
			continue
		}
		r.free = r.free[:0]
		for j := len(r.owner) - 1; j >= 0; j-- {
			if r.owner[j] == noOwner {
				r.free = append(r.free, uint32(j))
			}
		}
		switch {
		case len(r.free) > 0 && !r.listed:
			t.link(int32(ri))
		case len(r.free) == 0 && r.listed:
			t.unlink(int32(ri))
		}
	}
}

// verifyAll reads every indexed value and checks its crc32c; the keys that
// fail are dropped and their slots returned for zeroing.
func (t *tier2) verifyAll(its []*ioTask, xts *[]*xfer.Task) ([]staleSlot, error) {
	s := t.s
	var bad []staleSlot
	type item struct{ sh, idx uint32 }
	var pend []item
	batch := its[:0]
	run := func() error {
		if len(batch) == 0 {
			return nil
		}
		// A value the device cannot read keeps its key: its reads answer
		// the error, as without VerifyOnOpen.
		err := t.runReads(batch, xts)
		for i, it := range batch {
			p := pend[i]
			sh := &s.shards[p.sh]
			e := sh.ent(p.idx)
			if it.syncErr != nil && err == nil {
				t.s.rare(&t.s.c.unreadable, "store: an L2 value could not be read to verify it at start-up; its key stays",
					"key", fmt.Sprintf("%q", sh.keyOf(e)), "err", it.syncErr)
			}
			if err == nil && it.syncErr == nil && crc32c(s.poolMem[it.l1:it.l1+uint64(e.size)]) != e.crc {
				s.c.corrupt.Add(1)
				bad = append(bad, staleSlot{e.l2, string(sh.keyOf(e))})
				t.setOwner(e.l2, staleOwner)
				r, c, _, _ := t.slotAt(e.l2)
				t.regions[r].live--
				t.used -= t.g.slotSize(c)
				sh.unlistAll(p.idx)
				sh.remove(p.idx)
				s.c.keys.Add(^uint64(0))
				s.c.l2Keys.Add(^uint64(0))
				s.c.recovered.Add(^uint64(0))
			}
			if ferr := s.freeBlock(it.l1, uint32(e.size)); ferr != nil && err == nil {
				err = ferr
			}
		}
		batch, pend = batch[:0], pend[:0]
		return err
	}
	for si := range s.shards {
		sh := &s.shards[si]
		for idx := uint32(0); idx < sh.nents; idx++ {
			e := sh.ent(idx)
			if e.state != stReady || e.flags&fL2 == 0 {
				continue
			}
			off, err := s.allocBlock(uint64(e.size))
			if err != nil {
				if err := run(); err != nil {
					return nil, fmt.Errorf("store: verify L2: %w", err)
				}
				if off, err = s.allocBlock(uint64(e.size)); err != nil {
					return nil, fmt.Errorf("store: verify L2: no pool block: %w", err)
				}
			}
			it := its[len(batch)]
			it.l1, it.size = off, e.size
			_, _, _, soff := t.slotAt(e.l2)
			t.reqValue(it, xfer.OpRead, soff+t.g.align)
			batch = append(batch, it)
			pend = append(pend, item{uint32(si), idx})
			if len(batch) == len(its) {
				if err := run(); err != nil {
					return nil, fmt.Errorf("store: verify L2: %w", err)
				}
			}
		}
	}
	if err := run(); err != nil {
		return nil, fmt.Errorf("store: verify L2: %w", err)
	}
	return bad, nil
}

// staleSlot is a slot recovery zeroes: it holds a valid header of key,
// which no longer uses it.
type staleSlot struct {
	slot uint32
	key  string
}

// disown takes slot id, recovered as a key's block, from its key, which
// has a newer value (adoptL1): it is live no more, to be zeroed by
// zeroOlder.
func (t *tier2) disown(id uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ri, c, j, _ := t.slotAt(id)
	t.regions[ri].owner[j] = staleOwner
	t.regions[ri].live--
	t.used -= t.g.slotSize(c)
}

// zeroOlder zeroes the slots adoptL1 disowned, as recovery zeroes its
// stale ones, with every task of the table: it runs in New, after the
// recovery and before the maintenance loop starts.
func (t *tier2) zeroOlder(stale []staleSlot) {
	its := t.takeAll(len(t.tasks), nil)
	defer t.freeAll(its)
	var xts []*xfer.Task
	t.zeroStale(stale, its, &xts) // a slot it cannot zero is a ghost of its key
}

// zeroStale zeroes the headers of slots that hold a block no key uses, and
// frees them.
func (t *tier2) zeroStale(stale []staleSlot, its []*ioTask, xts *[]*xfer.Task) error {
	for len(stale) > 0 {
		n := min(len(stale), len(its))
		batch := its[:n]
		for i, it := range batch {
			_, _, _, off := t.slotAt(stale[i].slot)
			t.reqSector(it, xfer.OpWrite, off, true)
		}
		t.runSync(batch, xts)
		for i, it := range batch {
			if it.syncErr != nil {
				// Out of use for good, and live, so that its region never
				// empties: its header is still valid, a ghost of its key
				// that every invalidation of the key zeroes first
				// (reqInval). Without it, a Remove of the key's copy in
				// use would have the next restart bring this one back.
				ri, c, j, _ := t.slotAt(stale[i].slot)
				r := &t.regions[ri]
				r.owner[j] = quarOwner
				r.live++
				r.stuck++
				t.used += t.g.slotSize(c)
				t.quarantined++
				t.addGhost(stale[i].key, stale[i].slot)
				t.s.log.Error("store: could not zero a stale L2 block; its slot stays out of use", "err", it.syncErr)
				continue
			}
			ri, _, j, _ := t.slotAt(stale[i].slot)
			r := &t.regions[ri]
			r.owner[j] = noOwner
			r.free = append(r.free, j)
			if !r.listed {
				t.link(ri)
			}
		}
		stale = stale[n:]
	}
	return nil
}
