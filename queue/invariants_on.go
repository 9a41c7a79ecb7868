//go:build invariants

package queue

// invariants enables the rings' internal consistency checks (a CQE posted
// only into a reserved slot), which panic when broken.
const invariants = true
