package cluster

import (
	"cmp"
	"slices"
)

// DefaultShards is the number of shards the key space is split into by
// default.
const DefaultShards = 1024

// maxShards bounds Config.Shards.
const maxShards = 1 << 16

// fnv1a is the 64-bit FNV-1a hash: the same on every daemon, whatever
// its build.
func fnv1a(h uint64, b []byte) uint64 {
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return h
}

const fnvOffset = 14695981039346656037

// ShardOf is the shard of key among shards.
func ShardOf(key []byte, shards int) int {
	return int(fnv1a(fnvOffset, key) % uint64(shards))
}

// mix is a 64-bit finalizer (splitmix64's), so that nearby inputs score
// far apart.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// score is the rendezvous score for shard s of the member whose id hashes
// to seed (fnv1a of the id): the highest is the shard's home.
func score(seed uint64, s int) uint64 { return mix(seed ^ mix(uint64(s)+1)) }

// view is one set of members and the home of every shard among them,
// by rendezvous hashing: a shard's home is the member with the highest
// score for it, so a member that joins or leaves moves only the shards
// it wins or held. Immutable once built.
type view struct {
	members []string // sorted
	homes   []uint16 // shard → index in members
}

// newView computes the homes of shards among members (deduplicated).
func newView(members []string, shards int) *view {
	m := slices.Clone(members)
	slices.Sort(m)
	m = slices.Compact(m)
	v := &view{members: m, homes: make([]uint16, shards)}
	seeds := make([]uint64, len(m))
	for i, id := range m {
		seeds[i] = fnv1a(fnvOffset, []byte(id))
	}
	for s := range v.homes {
		best, bestScore := 0, uint64(0)
		for i, seed := range seeds {
			if sc := score(seed, s); i == 0 || sc > bestScore {
				best, bestScore = i, sc
			}
		}
		v.homes[s] = uint16(best)
	}
	return v
}

// home is the home of shard s.
func (v *view) home(s int) string { return v.members[v.homes[s]] }

// has reports whether id is a member.
func (v *view) has(id string) bool {
	_, ok := slices.BinarySearch(v.members, id)
	return ok
}

// ranked is the members of v other than those skip names, best first by
// rendezvous score for shard s: the order in which they would become its
// home as those before them go. At most n.
func (v *view) ranked(s int, n int, skip ...string) []string {
	return v.top(n, func(id string) uint64 { return score(fnv1a(fnvOffset, []byte(id)), s) }, skip...)
}

// top is the n members of v other than those skip names with the highest
// scores by score, best first.
func (v *view) top(n int, score func(id string) uint64, skip ...string) []string {
	if n <= 0 {
		return nil
	}
	type scored struct {
		id    string
		score uint64
	}
	all := make([]scored, 0, len(v.members))
	for _, id := range v.members {
		if !slices.Contains(skip, id) {
			all = append(all, scored{id, score(id)})
		}
	}
	slices.SortFunc(all, func(a, b scored) int { return cmp.Compare(b.score, a.score) })
	out := make([]string, 0, min(n, len(all)))
	for _, sc := range all[:min(n, len(all))] {
		out = append(out, sc.id)
	}
	return out
}
