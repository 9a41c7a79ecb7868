//go:build linux && cgo

package rdma

// Port is the device port the device was opened on (the configured one, or
// the first active port when no device was named).
func (d *Device) Port() int { return d.cfg.Port }
