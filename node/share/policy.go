// Package share decides what leaves a device and makes it ready to leave:
// the user's sharing policy ([share] in config.toml), the device's id key,
// and the Outbox, which turns the pool's scored steps into outbox batches:
// the steps the policy lets out, scrubbed (node/scrub), scored again as
// scrubbed when it is given a Rescorer (so that the scores that leave are
// of what leaves), and encoded in the batch wire format (mesh/batch),
// sealed in the pool under their content address; the steps it keeps on
// the device move to held. Nothing else makes the bytes that leave a
// device.
//
// It also answers what the next batch would be (Preview), so a user can see
// exactly what would leave before anything does.
package share

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/node/scrub"
)

// Mode says which steps may leave the device.
type Mode string

const (
	// ModeNone: nothing leaves, ever. The node learns from the mesh and
	// gives nothing back.
	ModeNone Mode = "none"
	// ModeScored: the scored steps that carry a learning signal (a reward
	// of at least MinRewardAbs, or a hint); main turns only.
	ModeScored Mode = "scored"
	// ModeAll: every scored step, signal or not, side turns included.
	ModeAll Mode = "all"
)

// ErrPolicy reports an invalid Policy.
var ErrPolicy = errors.New("share: bad policy")

// Policy is the user's sharing policy.
type Policy struct {
	// Mode; "" means DefaultMode for the caller's situation (see
	// DefaultMode).
	Mode Mode `json:"mode"`
	// Tools names the tools whose results may leave (scrubbed); results of
	// other tools are replaced by a placeholder. "*" allows every tool.
	// Empty: no tool result leaves.
	Tools []string `json:"tools,omitempty"`
	// Names are words and phrases to hide as well (people, projects).
	Names []string `json:"names,omitempty"`
	// MinRewardAbs leaves out, in ModeScored, steps whose |reward| is below
	// it (no signal). 0 keeps every step with a reward.
	MinRewardAbs float64 `json:"min_reward_abs,omitempty"`
}

// Summary says in one line what p lets leave the device. The policy must
// have a mode (see DefaultMode).
func (p Policy) Summary() string {
	var what string
	switch p.Mode {
	case ModeNone:
		return `nothing leaves this device ([share] mode = "none")`
	case ModeScored:
		what = `the scored steps that carry a learning signal leave, scrubbed, for the mesh's trainers ([share] mode = "scored")`
	case ModeAll:
		what = `every scored step leaves, scrubbed, for the mesh's trainers ([share] mode = "all")`
	default:
		return fmt.Sprintf("no sharing mode %q", p.Mode)
	}
	switch {
	case len(p.Tools) == 0:
		what += "; no tool result"
	case slices.Contains(p.Tools, "*"):
		what += "; every tool's results, scrubbed"
	default:
		what += "; the results of the tools " + strings.Join(p.Tools, ", ") + ", scrubbed"
	}
	return what
}

// DefaultMode is the mode of a policy that names none: ModeScored for a
// node that has joined a mesh, ModeNone for one that has not (there is
// nowhere for anything to go).
func DefaultMode(joined bool) Mode {
	if joined {
		return ModeScored
	}
	return ModeNone
}

// Validate checks p.
func (p Policy) Validate() error {
	switch p.Mode {
	case ModeNone, ModeScored, ModeAll:
	case "":
		return fmt.Errorf("%w: no mode (want none, scored or all)", ErrPolicy)
	default:
		return fmt.Errorf("%w: mode %q (want none, scored or all)", ErrPolicy, p.Mode)
	}
	if math.IsNaN(p.MinRewardAbs) || p.MinRewardAbs < 0 || p.MinRewardAbs > 1 {
		return fmt.Errorf("%w: min_reward_abs %v (want 0 to 1)", ErrPolicy, p.MinRewardAbs)
	}
	for _, t := range p.Tools {
		if strings.TrimSpace(t) == "" {
			return fmt.Errorf("%w: an empty tool name in tools", ErrPolicy)
		}
	}
	if _, err := scrub.New(scrub.Options{Names: p.Names}); err != nil {
		return fmt.Errorf("%w: names: %v", ErrPolicy, err)
	}
	return nil
}

// Digest names the policy's version: what selected and scrubbed a batch
// (12 hex digits of the SHA-256 of its canonical form). The names are
// hashed with the rest and cannot be read back from it.
func (p Policy) Digest() string {
	c := p
	c.Tools = slices.Sorted(slices.Values(c.Tools))
	c.Names = slices.Sorted(slices.Values(c.Names))
	b, _ := json.Marshal(c)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:6])
}

// Allows reports whether p lets the scored step s leave the device, and
// if not, why.
func (p Policy) Allows(s *core.Step) (bool, string) {
	switch p.Mode {
	case ModeAll:
		return true, ""
	case ModeScored:
	default:
		return false, "sharing is off (mode none)"
	}
	if s.Turn == core.TurnSide {
		return false, "a side turn"
	}
	r := s.Reward
	if r == nil {
		return false, "not scored"
	}
	if r.Value != nil && math.Abs(*r.Value) >= p.MinRewardAbs {
		return true, ""
	}
	if r.Hint != "" {
		return true, ""
	}
	if r.Value == nil {
		return false, "every plugin abstained and there is no hint"
	}
	return false, fmt.Sprintf("|reward| %.2f below min_reward_abs %.2f", math.Abs(*r.Value), p.MinRewardAbs)
}

// KeyFile is the file in the data directory that holds the device's id key
// (see scrub.HashID). It never leaves the device.
const KeyFile = "share.key"

// LoadKey reads the device's id key from dataDir, making it (32 random
// bytes, readable by the owner only) if there is none yet.
func LoadKey(dataDir string) ([]byte, error) {
	path := filepath.Join(dataDir, KeyFile)
	b, err := os.ReadFile(path)
	if err == nil {
		k, err := hex.DecodeString(strings.TrimSpace(string(b)))
		if err != nil || len(k) < 16 {
			return nil, fmt.Errorf("share: %s is damaged (want 64 hex digits); remove it to make a new key (the ids in what leaves will change)", path)
		}
		return k, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("share: id key: %w", err)
	}
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return nil, fmt.Errorf("share: id key: %w", err)
	}
	// Two processes may race to make it: the first wins, and both read
	// back what is there.
	if err := atomicfile.Create(path, []byte(hex.EncodeToString(k)+"\n"), 0o600); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("share: id key: %w", err)
	}
	return LoadKey(dataDir)
}
