package weights

import (
	"os"

	"golang.org/x/sys/unix"
)

// startWriteback asks the kernel to start writing a range of f to disk
// without waiting, so that the fsync at the end of a fetch finds little
// left to write.
func startWriteback(f *os.File, off int64, n int) {
	unix.SyncFileRange(int(f.Fd()), off, int64(n), unix.SYNC_FILE_RANGE_WRITE)
}
