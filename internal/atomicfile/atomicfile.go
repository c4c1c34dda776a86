// Package atomicfile writes small files so that a reader, or the next run
// after a crash, sees the old content or the new one, never a part: a
// temporary file in the same directory, synced, then renamed into place
// (Write) or linked there only if nothing is (Create), and the directory
// synced.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write replaces path by data, with permissions perm, making the directory
// (0700) if needed.
func Write(path string, data []byte, perm os.FileMode) error {
	return place(path, data, perm, os.Rename)
}

// Create writes data to path only if path does not exist yet; if another
// process made it first, the error wraps fs.ErrExist and what is there
// stays. For files made once and never replaced, such as keys.
func Create(path string, data []byte, perm os.FileMode) error {
	return place(path, data, perm, os.Link)
}

func place(path string, data []byte, perm os.FileMode, put func(tmp, path string) error) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a rename, harmlessly fails
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(perm)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := put(tmp.Name(), path); err != nil {
		return err
	}
	SyncDir(dir)
	return nil
}

// SyncDir flushes a directory's entries (a rename, a link) to disk, where
// the platform allows it.
func SyncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}
