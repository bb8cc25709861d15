package fencecli

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/fencekeeper/fencekeeper/pkg/lease"
)

// Every check here runs in cobra's Args or PreRunE, before any API call: a
// typo must cost no request, and above all no place in a lock's queue (an
// unknown -o found after acquiring would leave a granted lease nobody
// reports).

// TTL bounds of a claim (the CRD's leaseDurationSeconds: 1..86400).
const (
	minTTL = time.Second
	maxTTL = 24 * time.Hour
)

// usageError says what was wrong and what to type instead.
func usageError(cmd *cobra.Command, format string, a ...any) error {
	msg := fmt.Sprintf(format, a...) + "\nusage: " + cmd.UseLine()
	if cmd.Example != "" {
		msg += "\nexample:\n" + cmd.Example
	}
	return errors.New(msg)
}

// oneLock is the Args of commands that take exactly one LOCK.
func oneLock(cmd *cobra.Command, args []string) error {
	switch {
	case len(args) == 0:
		return usageError(cmd, "missing LOCK: the name of the lock")
	case len(args) > 1:
		return usageError(cmd, "one LOCK only, got %d arguments: %q", len(args), args)
	}
	return validLock(args[0])
}

func validLock(lock string) error { return lease.ValidateLockName(lock) }

func validHolder(holder string) error {
	switch {
	case holder == "":
		return fmt.Errorf("--holder is empty (and neither $POD_NAME nor the hostname gives a default): pass --holder ID")
	case len(holder) > 253:
		return fmt.Errorf("--holder %q: at most 253 characters", holder)
	}
	return nil
}

func validTTL(ttl time.Duration) error {
	if ttl < minTTL || ttl > maxTTL || ttl%time.Second != 0 {
		return fmt.Errorf("--ttl %v: want whole seconds from 1s to 24h (default 15s)", ttl)
	}
	return nil
}

// maxWait is the longest --wait of acquire and run: it is the claim's
// acquireTimeoutSeconds (0..86400).
const maxWait = 24 * time.Hour

func validWait(wait time.Duration) error {
	if wait < 0 || wait > maxWait {
		return fmt.Errorf("--wait %v: want 0 (wait forever, the default) or a positive duration up to 24h such as 30s", wait)
	}
	return nil
}
