package personal

import (
	"context"

	"github.com/clawmesh/clawmesh/internal/core"
)

// Trainer trains a personal adapter. The node never trains itself: it
// hands the job to a Trainer (a worker process on the device under
// [personal] mode local, a trusted trainer peer under mode mesh).
type Trainer interface {
	Train(ctx context.Context, j core.PersonalJob) (core.PersonalResult, error)
}
