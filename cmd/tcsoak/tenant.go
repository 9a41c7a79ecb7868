package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/tensorcast/tensorcast/client"
)

// The soak's tenants. Root (every client of the soak) is tenant soakTenant
// on both daemons, so the tcp clients of a reach b's export as their own
// tenant's; hostileUID is tenant hostileTenant on a, whose client the
// tenant fault runs (with gid 0, so that it may use the socket).
const (
	soakTenant    = "soak"
	hostileTenant = "hostile"
	hostileUID    = 61002
)

// tenantConfig is a daemon's [[tenants]]: soakTenant with its files in
// files (and allowed), and on a also hostileTenant.
func tenantConfig(withHostile bool, files ...string) []string {
	q := make([]string, len(files))
	for i, f := range files {
		q[i] = fmt.Sprintf("%q", f)
	}
	conf := []string{"[[tenants]]", fmt.Sprintf("name = %q", soakTenant), "uids = [0]", `pool_size = "64MiB"`,
		"allowed_files = [" + strings.Join(q, ", ") + "]"}
	if withHostile {
		conf = append(conf, "[[tenants]]", fmt.Sprintf("name = %q", hostileTenant), fmt.Sprintf("uids = [%d]", hostileUID),
			`pool_size = "16MiB"`)
	}
	return conf
}

// hostileResult is what the hostile client reports: for each attempt, the
// code it got ("OK" is a breach unless said otherwise).
type hostileResult struct {
	Codes map[string]string `json:"codes"`
}

// runHostile is the tenant fault's client (a process of uid hostileUID):
// it tries what a neighbour on the same host would against tenant soak's
// files, store and the peer's export, and reports each answer.
func runHostile(socket, peer, dir, probeKey string) int {
	out := hostileResult{Codes: map[string]string{}}
	c, err := client.Dial(socket, client.Options{Name: "tcsoak-hostile", NoPool: true, CallTimeout: 10 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, "hostile:", err)
		return 1
	}
	defer c.Close()
	// A new file in soak's directory, an existing one grown, the store's
	// L2 by name and through /proc/self/fd.
	for name, path := range map[string]string{
		"create": filepath.Join(dir, "created-by-hostile.bin"),
		"grow":   firstMatch(filepath.Join(dir, "soak-*.bin")),
		"l2":     filepath.Join(dir, "store.l2"),
	} {
		_, _, err := c.RegisterFile(path, false, 32<<20)
		out.Codes["file-"+name] = codeOf(err)
	}
	// The peer's export of tenant soak, by its own tenant's name and as
	// soak's.
	for name, seg := range map[string]string{"own-name": peer + "/soak-kv", "soak-name": peer + "/" + soakTenant + "/soak-kv"} {
		_, err := c.OpenRemote(seg, client.RightRead)
		out.Codes["remote-"+name] = codeOf(err)
	}
	// Tenant soak's key: not there for this tenant; put under the same
	// name in its own store.
	_, err = c.GetBytes([]byte(probeKey))
	out.Codes["store-get"] = codeOf(err)
	out.Codes["store-put"] = codeOf(c.PutBytes([]byte(probeKey), []byte("hostile bytes"), false))
	ss, err := c.Segments()
	out.Codes["segments"] = codeOf(err)
	for _, s := range ss {
		if s.Peer == "" {
			out.Codes["segments"] = "LISTED " + s.Name
		}
	}
	_ = json.NewEncoder(os.Stdout).Encode(out)
	return 0
}

// tenantFault runs the hostile client against d (tenant soak's files in
// dir, peer's export soak-kv) and checks that it changed nothing of
// soak's: no file created or grown, the probe key's value the same, each
// attempt refused.
func tenantFault(self string, d *daemon, peer, dir string, round int) (string, error) {
	probe := fmt.Sprintf("tenantprobe/%d", round)
	val := bytes.Repeat([]byte{byte(round)}, 4096)
	c, err := client.Dial(d.socket, client.Options{Name: "tcsoak-tenant-probe", NoPool: true, CallTimeout: 10 * time.Second})
	if err != nil {
		return "", err
	}
	defer c.Close()
	if err := c.PutBytes([]byte(probe), val, false); err != nil {
		return "", fmt.Errorf("the probe's put: %w", err)
	}
	before := dirSizes(dir)
	cmd := exec.Command(self, "-client", "hostile", "-socket", d.socket, "-peer", peer, "-dir", dir, "-probe", probe)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: hostileUID, Gid: 0}}
	cmd.Stderr = os.Stderr
	outb, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("the hostile client: %w", err)
	}
	var res hostileResult
	if err := json.Unmarshal(outb, &res); err != nil {
		return "", fmt.Errorf("the hostile client's report %q: %w", outb, err)
	}
	var breaches []string
	for what, code := range res.Codes {
		ok := code != "OK"
		switch what {
		case "store-get":
			ok = code == "NOT_FOUND"
		case "store-put", "segments":
			ok = code == "OK" // in its own store; its own (empty) listing
		}
		if !ok {
			breaches = append(breaches, what+": "+code)
		}
	}
	after := dirSizes(dir)
	for name, size := range after {
		if b, ok := before[name]; !ok || b != size {
			// The uring clients grow nothing (their files are made at
			// 16 MiB); a new or grown file is the hostile tenant's.
			if strings.HasPrefix(name, "created-by-hostile") || b != size && ok {
				breaches = append(breaches, fmt.Sprintf("file %s: %d bytes before, %d after", name, b, size))
			}
		}
	}
	got, err := c.GetBytes([]byte(probe))
	if err != nil || !bytes.Equal(got, val) {
		breaches = append(breaches, fmt.Sprintf("tenant soak's probe key after the hostile put: %v, %d bytes", codeOf(err), len(got)))
	}
	_ = c.StoreRemove([][]byte{[]byte(probe)}, make([]error, 1))
	if len(breaches) > 0 {
		return "", errors.New("tenant isolation broken: " + strings.Join(breaches, "; "))
	}
	return fmt.Sprintf("a client of tenant %s (uid %d) was refused soak's files (create, grow, store.l2), b's export (both names) and soak's key; nothing of soak's changed (%d answers)",
		hostileTenant, hostileUID, len(res.Codes)), nil
}

// dirSizes are the sizes of the regular files in dir.
func dirSizes(dir string) map[string]int64 {
	out := map[string]int64{}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			out[e.Name()] = fi.Size()
		}
	}
	return out
}

// firstMatch is the first file pattern matches, or pattern itself.
func firstMatch(pattern string) string {
	if m, _ := filepath.Glob(pattern); len(m) > 0 {
		return m[0]
	}
	return pattern
}
