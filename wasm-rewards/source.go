//go:build !wasip1

package rewards

import (
	"embed"
	"io/fs"
)

//go:embed rewards.go flat.go host_wasip1.go host_other.go
var source embed.FS

// Source returns the kit's own Go source files (without this one), so that
// `clawmesh reward new` can give a new plugin a copy that builds offline.
func Source() fs.FS { return source }
