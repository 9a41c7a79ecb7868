package config

import "strconv"

// MetricsOff reports whether the config serves no metrics endpoint.
func (c *Config) MetricsOff() bool { return c.MetricsAddress == "" || c.MetricsAddress == "off" }

// validateOps checks the operations keys: metrics_address, ebpf and
// ebpf_uring_sample.
func (c *Config) validateOps() error {
	if !c.MetricsOff() {
		if err := checkHostPort("metrics_address", c.MetricsAddress); err != nil {
			return badValue("metrics_address", c.MetricsAddress, `must be host:port (e.g. 127.0.0.1:9464) or "off"`)
		}
	}
	switch c.EBPF {
	case "auto", "on", "off":
	default:
		return badValue("ebpf", c.EBPF, "must be auto, on or off")
	}
	if c.EBPFUringSample < 1 || c.EBPFUringSample > 1<<16 {
		return badValue("ebpf_uring_sample", strconv.Itoa(c.EBPFUringSample), "must be 1..65536")
	}
	return nil
}
