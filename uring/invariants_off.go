//go:build !invariants

package uring

const invariants = false
