package bench

import (
	"os"
	"syscall"
)

// syncData flushes f's data (not its metadata, as a write-ahead log that
// overwrites a preallocated file needs).
func syncData(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }
