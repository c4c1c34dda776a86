package weights

import (
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// startWriteback asks the kernel to start writing a range of f to disk
// without waiting, so that the fsync at the end of a fetch finds little
// left to write.
func startWriteback(f *os.File, off int64, n int) {
	unix.SyncFileRange(int(f.Fd()), off, int64(n), unix.SYNC_FILE_RANGE_WRITE)
}

// openDirect opens path for writes that bypass the page cache (O_DIRECT),
// or returns nil where the file system does not allow them.
func openDirect(path string) *os.File {
	f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_DIRECT, 0)
	if err != nil {
		return nil
	}
	return f
}
