package store

import "time"

type (
	time0 = time.Time
	dur   = time.Duration
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
