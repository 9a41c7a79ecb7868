package main

import (
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/tensorcast/tensorcast/client"
)

// Retention handles, placement leases and the mode. A handle's token is
// printed and read as hex: it is the capability, and any holder of it may
// renew or release the handle.

const defaultGrantTTL = time.Minute

func keysOf(args []string) [][]byte {
	keys := make([][]byte, len(args))
	for i, a := range args {
		keys[i] = []byte(a)
	}
	return keys
}

// subcommand parses the flags of `cmd SUB [--ttl D] ARGS...` (args start
// at SUB): the flag set, with the operands, and the TTL.
func subcommand(cmd, use, ttlHelp string, args []string, stderr io.Writer) (*flag.FlagSet, time.Duration, error) {
	if len(args) == 0 {
		return nil, 0, fmt.Errorf("%w: %s", errUsage, use)
	}
	fs := flag.NewFlagSet(cmd+" "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	ttl := fs.Duration("ttl", defaultGrantTTL, ttlHelp)
	if err := fs.Parse(args[1:]); err != nil {
		return nil, 0, fmt.Errorf("%w: %s", errUsage, use)
	}
	return fs, *ttl, nil
}

func handleCmd(sock string, args []string, stdout, stderr io.Writer) error {
	const use = "handle issue [--ttl D] KEY... | handle renew [--ttl D] TOKEN | handle release TOKEN"
	fs, ttl, err := subcommand("handle", use, "time to live (from now)", args, stderr)
	if err != nil {
		return err
	}
	var token []byte
	switch args[0] {
	case "issue":
		if fs.NArg() == 0 {
			return fmt.Errorf("%w: %s", errUsage, use)
		}
	case "renew", "release":
		if fs.NArg() != 1 {
			return fmt.Errorf("%w: %s", errUsage, use)
		}
		if token, err = hex.DecodeString(fs.Arg(0)); err != nil || len(token) == 0 {
			return fmt.Errorf("%w: the token is the hex that handle issue printed", errUsage)
		}
	default:
		return fmt.Errorf("%w: %s", errUsage, use)
	}
	c, err := dial(sock, false)
	if err != nil {
		return err
	}
	defer c.Close()
	switch args[0] {
	case "issue":
		h, err := c.HandleIssue(keysOf(fs.Args()), ttl)
		if err != nil {
			return fmt.Errorf("handle issue: %s", codeName(err))
		}
		fmt.Fprintf(stdout, "token:   %x\nhandle:  %d\nexpires: %s\n", h.Token, h.ID, h.Expiry.UTC().Format(time.RFC3339Nano))
	case "renew":
		h, err := c.HandleRenew(token, ttl)
		if err != nil {
			return fmt.Errorf("handle renew: %s", codeName(err))
		}
		fmt.Fprintf(stdout, "token:   %x\nexpires: %s\n", h.Token, h.Expiry.UTC().Format(time.RFC3339Nano))
	case "release":
		if err := c.HandleRelease(token); err != nil {
			return fmt.Errorf("handle release: %s", codeName(err))
		}
	}
	return nil
}

func leaseCmd(sock string, args []string, stdout, stderr io.Writer) error {
	const use = "lease create [--ttl D] OP KEY... | lease release OP"
	fs, ttl, err := subcommand("lease", use, "time to live (from the first create)", args, stderr)
	if err != nil {
		return err
	}
	switch {
	case args[0] == "create" && fs.NArg() >= 2, args[0] == "release" && fs.NArg() == 1:
	default:
		return fmt.Errorf("%w: %s", errUsage, use)
	}
	c, err := dial(sock, false)
	if err != nil {
		return err
	}
	defer c.Close()
	op := []byte(fs.Arg(0))
	if args[0] == "release" {
		if err := c.LeaseRelease(op); err != nil {
			return fmt.Errorf("lease release %s: %s", op, codeName(err))
		}
		return nil
	}
	l, err := c.LeaseCreate(op, keysOf(fs.Args()[1:]), ttl)
	if err != nil {
		return fmt.Errorf("lease create %s: %s", op, codeName(err))
	}
	how := "created"
	if l.Joined {
		how = "joined (an earlier create with this operation id made it)"
	}
	fmt.Fprintf(stdout, "lease:   %s %s\nexpires: %s\n", op, how, l.Expiry.UTC().Format(time.RFC3339Nano))
	return nil
}

func modeCmd(sock string, args []string, stdout io.Writer) error {
	const use = "mode [show] | mode set local-first|budgeted-hybrid|global-governed"
	var set string
	switch {
	case len(args) == 0, len(args) == 1 && args[0] == "show":
	case len(args) == 2 && args[0] == "set":
		set = args[1]
	default:
		return fmt.Errorf("%w: %s", errUsage, use)
	}
	c, err := dial(sock, false)
	if err != nil {
		return err
	}
	defer c.Close()
	var m client.ModeInfo
	if set != "" {
		m, err = c.SetMode(set)
	} else {
		m, err = c.Mode()
	}
	if err != nil {
		return fmt.Errorf("mode: %s", codeName(err))
	}
	rate := "unbounded"
	if m.ServeBytesPerSec > 0 {
		rate = bytesStr(m.ServeBytesPerSec) + "/s"
	}
	fmt.Fprintf(stdout, "mode:            %s\n", m.Mode)
	fmt.Fprintf(stdout, "remote gets:     %d in flight of %d (refused %d)\n", m.RemoteGetsInFlight, m.RemoteGets, m.GetsRefused)
	fmt.Fprintf(stdout, "serving peers:   %s (refused %d)\n", rate, m.ServesRefused)
	return nil
}
