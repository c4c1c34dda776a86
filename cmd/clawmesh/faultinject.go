//go:build faultinject

package main

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// Built with -tags faultinject (tests only), the node's pool is on a disk
// that stops answering: while DATA/wedge exists, every write and sync of
// the pool's WAL blocks for good, as on a disk that hangs.
func init() {
	poolFS = func(data string) vfs.FS {
		return errorfs.Wrap(vfs.Default, wedge(filepath.Join(data, "wedge")))
	}
}

// wedge blocks WAL writes while the file it names exists.
type wedge string

func (w wedge) MaybeError(op errorfs.Op) error {
	switch op.Kind {
	case errorfs.OpFileWrite, errorfs.OpFileWriteAt, errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
	default:
		return nil
	}
	if !strings.HasSuffix(op.Path, ".log") {
		return nil
	}
	if _, err := os.Stat(string(w)); err == nil {
		select {} // a disk that stopped answering
	}
	return nil
}

func (w wedge) String() string { return "wedged while " + string(w) + " exists" }
