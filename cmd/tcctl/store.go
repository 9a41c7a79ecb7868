package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/tensorcast/tensorcast/client"
)

// stdin is what `put KEY -` reads (tests replace it).
var stdin io.Reader = os.Stdin

// maxPutBytes bounds what put reads: more than any value the store takes
// (values are one pool block), so the daemon's own answer says too large.
const maxPutBytes = 1 << 30

// codeName is what a store command prints for a failure: the status
// code's name when the daemon answered one, else the error.
func codeName(err error) string {
	var se *client.StatusError
	if errors.As(err, &se) {
		return se.Code.String()
	}
	return err.Error()
}

// storeFailed is a store command's failure: "CMD KEY: CODE".
func storeFailed(cmd, key string, err error) error {
	return fmt.Errorf("%s %s: %s", cmd, key, codeName(err))
}

func putCmd(sock string, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("put", flag.ContinueOnError)
	fs.SetOutput(stderr)
	durable := fs.Bool("durable", false, "answer only once the value is on L2")
	if err := fs.Parse(args); err != nil || fs.NArg() != 2 {
		return fmt.Errorf("%w: put [--durable] KEY FILE (FILE - is stdin)", errUsage)
	}
	key, file := fs.Arg(0), fs.Arg(1)
	var r io.Reader = stdin
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return err
		}
		defer f.Close()
		r = f
	}
	val, err := io.ReadAll(io.LimitReader(r, maxPutBytes+1))
	if err != nil {
		return fmt.Errorf("put %s: reading %s: %w", key, file, err)
	}
	if len(val) > maxPutBytes {
		return fmt.Errorf("put %s: %s is larger than %d bytes", key, file, maxPutBytes)
	}
	c, err := dial(sock, false)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.PutBytes([]byte(key), val, *durable); err != nil {
		return storeFailed("put", key, err)
	}
	return nil
}

func getCmd(sock string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("get", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil || fs.NArg() < 1 || fs.NArg() > 2 {
		return fmt.Errorf("%w: get KEY [FILE]", errUsage)
	}
	key := fs.Arg(0)
	c, err := dial(sock, false)
	if err != nil {
		return err
	}
	defer c.Close()
	val, err := c.GetBytes([]byte(key))
	if err != nil {
		return storeFailed("get", key, err)
	}
	if fs.NArg() == 1 || fs.Arg(1) == "-" {
		_, err := stdout.Write(val)
		return err
	}
	return os.WriteFile(fs.Arg(1), val, 0o644)
}

func rmCmd(sock string, args []string, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: rm KEY [KEY ...]", errUsage)
	}
	c, err := dial(sock, false)
	if err != nil {
		return err
	}
	defer c.Close()
	keys := make([][]byte, len(args))
	for i, a := range args {
		keys[i] = []byte(a)
	}
	res := make([]error, len(keys))
	if err := c.StoreRemove(keys, res); err != nil {
		return storeFailed("rm", strings.Join(args, " "), err)
	}
	failed := 0
	for i, r := range res {
		if r != nil {
			fmt.Fprintf(stderr, "tcctl: rm %s: %s\n", args[i], codeName(r))
			failed++
		}
	}
	if failed > 0 {
		return fmt.Errorf("rm: %d of %d keys not removed", failed, len(keys))
	}
	return nil
}

// showKey prints a key as it is when it is plain printable text without
// spaces, else quoted with escapes.
func showKey(k []byte) string {
	for _, b := range k {
		if b <= ' ' || b > '~' || b == '"' {
			return strconv.Quote(string(k))
		}
	}
	return string(k)
}

func tierOf(k client.KeyInfo) string {
	switch {
	case k.InL1 && k.InL2:
		return "l1+l2"
	case k.InL1:
		return "l1"
	case k.InL2:
		return "l2"
	}
	return "-"
}

func lsCmd(sock string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ls", flag.ContinueOnError)
	fs.SetOutput(stderr)
	prefix := fs.String("prefix", "", "only keys that start with P")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		return fmt.Errorf("%w: ls [--prefix P]", errUsage)
	}
	c, err := dial(sock, false)
	if err != nil {
		return err
	}
	defer c.Close()
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tSIZE\tTIER\tPINS")
	var after []byte
	for {
		keys, more, err := c.StoreList([]byte(*prefix), after, 0)
		if err != nil {
			tw.Flush()
			return storeFailed("ls", *prefix, err)
		}
		for _, k := range keys {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\n", showKey(k.Key), k.Size, tierOf(k), k.Pins)
		}
		if !more || len(keys) == 0 {
			break
		}
		after = keys[len(keys)-1].Key
	}
	return tw.Flush()
}

func statCmd(sock string, args []string, stdout io.Writer) error {
	if len(args) != 1 {
		return fmt.Errorf("%w: stat KEY", errUsage)
	}
	c, err := dial(sock, false)
	if err != nil {
		return err
	}
	defer c.Close()
	k, err := c.StoreStat([]byte(args[0]))
	if err != nil {
		return storeFailed("stat", args[0], err)
	}
	wb := "on L2"
	switch {
	case k.Tombstone:
		wb = "gave up (tombstone): in L1 only"
	case k.Dirty:
		wb = "owed"
	case !k.InL2:
		wb = "none (no L2)"
	}
	fmt.Fprintf(stdout, "key:        %s\n", showKey(k.Key))
	fmt.Fprintf(stdout, "size:       %d\n", k.Size)
	fmt.Fprintf(stdout, "tier:       %s\n", tierOf(k))
	fmt.Fprintf(stdout, "pins:       %d\n", k.Pins)
	fmt.Fprintf(stdout, "writeback:  %s\n", wb)
	return nil
}
