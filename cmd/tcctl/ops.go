package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/daemon/config"
	"github.com/tensorcast/tensorcast/wire"
)

// statsJSON is `tcctl stats --json`: every group as an object of counter
// name to value.
type statsJSON struct {
	Connections int               `json:"connections"`
	Pool        map[string]uint64 `json:"pool"`
	Engine      map[string]uint64 `json:"engine"`
	Connection  map[string]uint64 `json:"connection"`
	Transports  map[string]uint64 `json:"transports"`
	Store       map[string]uint64 `json:"store"`
}

func counterMap(cs []wire.Counter) map[string]uint64 {
	m := make(map[string]uint64, len(cs))
	for _, c := range cs {
		m[c.Name] = c.Value
	}
	return m
}

func writeStatsJSON(w io.Writer, st client.Stats) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(statsJSON{
		Connections: st.Connections,
		Pool:        counterMap(st.Pool),
		Engine:      counterMap(st.Engine),
		Connection:  counterMap(st.Connection),
		Transports:  counterMap(st.Transports),
		Store:       counterMap(st.Store),
	})
}

// configCmd is `tcctl config check FILE`.
func configCmd(args []string, w, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "check" {
		return fmt.Errorf("%w: config check FILE", errUsage)
	}
	fs := flag.NewFlagSet("config check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := fs.Parse(args[1:]); err != nil || fs.NArg() != 1 {
		return fmt.Errorf("%w: config check FILE", errUsage)
	}
	path := fs.Arg(0)
	problems, err := config.CheckFile(path)
	if err != nil {
		return err
	}
	if len(problems) == 0 {
		fmt.Fprintf(w, "%s: ok\n", path)
		return nil
	}
	for _, p := range problems {
		if p.Line > 0 {
			fmt.Fprintf(w, "%s:%d: %s\n", path, p.Line, p)
		} else {
			fmt.Fprintf(w, "%s: %s\n", path, p)
		}
	}
	return fmt.Errorf("%s: %d problem(s)", path, len(problems))
}
