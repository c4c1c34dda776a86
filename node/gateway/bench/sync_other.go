//go:build !linux

package bench

import "os"

// syncData flushes f (fsync: there is no data-only sync here).
func syncData(f *os.File) error { return f.Sync() }
