package main

import (
	"fmt"
	"net"
	"time"

	"github.com/tensorcast/tensorcast/client"
)

// metricsFlood opens n idle connections to d's metrics endpoint and holds
// them for hold, while new control clients connect and ping all along:
// each must be served, and the control socket must count no failed
// accept over the flood (the endpoint leaves the descriptors the control
// socket needs). Once the connections close, the endpoint serves again.
func metricsFlood(d *daemon, n int, hold time.Duration) (string, error) {
	before, err := scrapeGauge(d.metrics, "tensorcast_control_accept_failures_total")
	if err != nil {
		return "", err
	}
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c, err := net.DialTimeout("tcp", d.metrics, 5*time.Second)
		if err != nil {
			break // the backlog is full: what is open is the flood
		}
		conns = append(conns, c)
	}
	served := 0
	for end := time.Now().Add(hold); time.Now().Before(end); served++ {
		c, err := client.Dial(d.socket, client.Options{Name: "tcsoak-metrics-flood", NoPool: true, CallTimeout: 10 * time.Second})
		if err == nil {
			err = c.Ping(nil)
			c.Close()
		}
		if err != nil {
			return "", fmt.Errorf("control client %d during a flood of %d metrics connections: %w", served, len(conns), err)
		}
		time.Sleep(100 * time.Millisecond) // a client's pace, not a wait for an event
	}
	for _, c := range conns {
		c.Close()
	}
	held := len(conns)
	conns = nil
	// The endpoint lets go of the closed connections and serves again.
	var after int
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if after, err = scrapeGauge(d.metrics, "tensorcast_control_accept_failures_total"); err == nil || time.Now().After(end) {
			break
		}
	}
	if err != nil {
		return "", fmt.Errorf("metrics endpoint after the flood: %w", err)
	}
	if after != before {
		return "", fmt.Errorf("%d failed control accepts during a flood of %d metrics connections", after-before, held)
	}
	refused, err := scrapeGauge(d.metrics, "tensorcast_metrics_refused_total")
	return fmt.Sprintf("%d idle metrics connections on %s for %v: %d new control clients served, no failed accept (%d metrics connections refused so far)",
		held, d.name, hold, served, refused), err
}
