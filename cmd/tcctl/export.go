package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/wire"
)

// maxExportBytes bounds the file export copies into its buffer.
const maxExportBytes = 1 << 30

// grantList is export's repeatable --grant.
type grantList []string

func (g *grantList) String() string { return strings.Join(*g, ",") }

func (g *grantList) Set(s string) error {
	if len(*g) == wire.MaxGrants {
		return fmt.Errorf("at most %d tenants", wire.MaxGrants)
	}
	*g = append(*g, s)
	return nil
}

// exportCmd copies FILE into a buffer of its own, exports it read-only to
// the peer daemons' clients of this user's tenant as NAME, and to those
// of the tenants --grant names, and holds the export until it is
// interrupted (SIGINT, SIGTERM) or its standard input ends; then it
// unexports it, which takes it from the granted tenants too.
func exportCmd(sock string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("export", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var grants grantList
	fs.Var(&grants, "grant", "a tenant whose clients on peer daemons may open the export too (repeatable)")
	if err := fs.Parse(args); err != nil || fs.NArg() != 2 {
		return fmt.Errorf("%w: export [--grant TENANT]... NAME FILE", errUsage)
	}
	name, file := fs.Arg(0), fs.Arg(1)
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	data, err := io.ReadAll(io.LimitReader(f, maxExportBytes+1))
	f.Close()
	switch {
	case err != nil:
		return fmt.Errorf("export %s: reading %s: %w", name, file, err)
	case len(data) == 0:
		return fmt.Errorf("export %s: %s is empty", name, file)
	case len(data) > maxExportBytes:
		return fmt.Errorf("export %s: %s is larger than %d bytes", name, file, maxExportBytes)
	}
	c, err := dial(sock, false)
	if err != nil {
		return err
	}
	defer c.Close()
	buf, err := c.RegisterBuffer(uint64(len(data)))
	if err != nil {
		return fmt.Errorf("export %s: a buffer of %d bytes: %s", name, len(data), codeName(err))
	}
	copy(buf.Mem, data)
	// Held from before the export: a signal meanwhile still unexports.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	size, err := c.ExportSegmentTo(name, grants, buf.ID, 0, 0, client.RightRead)
	if err != nil {
		return fmt.Errorf("export %s: %s", name, codeName(err))
	}
	to := "no other tenant"
	if len(grants) > 0 {
		to = "tenants " + grants.String()
	}
	fmt.Fprintf(stdout, "exported %s: %d bytes, read-only, granted to %s; held until interrupted or stdin ends\n", name, size, to)
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		_, _ = io.Copy(io.Discard, stdin)
	}()
	select {
	case <-sig:
	case <-ended:
	}
	if err := c.UnexportSegment(name); err != nil {
		return fmt.Errorf("unexport %s: %s", name, codeName(err))
	}
	fmt.Fprintf(stdout, "unexported %s\n", name)
	return nil
}
