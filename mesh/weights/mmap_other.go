//go:build !unix

package weights

import "os"

// mapFile does not map files here: bundles are read with ReadAt.
func mapFile(*os.File, int64) []byte { return nil }

func unmap([]byte) {}
