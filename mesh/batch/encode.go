package batch

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/klauspost/compress/zstd"

	"github.com/clawmesh/clawmesh/internal/core"
)

// sharedEncoder is built on first use and shared: EncodeAll is safe for
// concurrent use, and with concurrency 1 the batch encodes of a process run
// one at a time in one encoder's memory (a device encodes a batch now and
// then; trainers only decode). The options fix the output: a fixed level,
// one segment with the content size in the frame header (the decoder checks
// it before it decompresses), no xxhash checksum (the header's sha256 covers
// the body).
var sharedEncoder = sync.OnceValues(func() (*zstd.Encoder, error) {
	return zstd.NewWriter(nil,
		zstd.WithEncoderConcurrency(1),
		zstd.WithEncoderLevel(zstd.SpeedDefault),
		zstd.WithSingleSegment(true),
		zstd.WithEncoderCRC(false),
	)
})

// Encode makes a batch of steps, in the order given, described by meta. Every
// step must pass (*core.Step).Validate, ids must be distinct, and there must
// be at least one step; the batch must fit the default Limits. The same
// meta and steps always give the same bytes.
func Encode(meta Meta, steps []*core.Step) ([]byte, error) {
	if len(steps) == 0 {
		return nil, fmt.Errorf("%w: no steps", ErrMalformed)
	}
	if len(steps) > defaultMaxSteps {
		return nil, fmt.Errorf("%w: %d steps, limit %d", ErrTooLarge, len(steps), defaultMaxSteps)
	}
	seen := make(map[core.StepID]int, len(steps))
	var body bytes.Buffer
	lw := newLineWriter(&body)
	for i, s := range steps {
		if s == nil {
			return nil, fmt.Errorf("%w: step %d is nil", ErrMalformed, i)
		}
		if err := s.Validate(); err != nil {
			return nil, fmt.Errorf("%w: step %d: %v", ErrMalformed, i, err)
		}
		if j, dup := seen[s.ID]; dup {
			return nil, fmt.Errorf("%w: step %d: duplicate step id %q (also step %d)", ErrMalformed, i, s.ID, j)
		}
		seen[s.ID] = i
		if err := lw.write(s); err != nil {
			return nil, fmt.Errorf("%w: step %d (id %q): %v", ErrMalformed, i, s.ID, err)
		}
		if body.Len() > defaultMaxBody {
			return nil, fmt.Errorf("%w: body passes %d bytes at step %d", ErrTooLarge, defaultMaxBody, i)
		}
	}

	sum := sha256.Sum256(body.Bytes())
	h := Header{
		Schema:     Schema,
		StepSchema: core.SchemaVersion,
		Created:    meta.Created.UTC(),
		Policy:     meta.Policy,
		Steps:      len(steps),
		BodyBytes:  int64(body.Len()),
		BodySHA256: hex.EncodeToString(sum[:]),
	}
	h.Sessions, h.Rewards, h.Plugins, h.Adapters = summarize(steps)
	hj, err := marshalHeader(h)
	if err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrMalformed, err)
	}
	if len(hj) > defaultMaxHeader {
		return nil, fmt.Errorf("%w: header JSON is %d bytes, limit %d", ErrTooLarge, len(hj), defaultMaxHeader)
	}

	zenc, err := sharedEncoder()
	if err != nil {
		return nil, fmt.Errorf("batch: zstd encoder: %w", err)
	}
	out := make([]byte, 0, len(magic)+1+binary.MaxVarintLen64+len(hj)+body.Len()/8)
	out = append(out, magic...)
	out = append(out, formatVersion)
	out = binary.AppendUvarint(out, uint64(len(hj)))
	out = append(out, hj...)
	out = zenc.EncodeAll(body.Bytes(), out)
	if len(out) > defaultMaxBytes {
		return nil, fmt.Errorf("%w: batch is %d bytes, limit %d", ErrTooLarge, len(out), defaultMaxBytes)
	}
	return out, nil
}

// lineWriter writes steps as body lines: the canonical form of a line is
// what it writes. Decode re-encodes each line with one to check it.
type lineWriter struct {
	enc *json.Encoder
}

func newLineWriter(buf *bytes.Buffer) lineWriter {
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	return lineWriter{enc: enc}
}

// write appends s as one JSONL line, "\n" included.
func (w lineWriter) write(s *core.Step) error {
	return w.enc.Encode(core.ExportedStep{Schema: core.SchemaVersion, Step: *s})
}

// marshalHeader is the canonical header JSON: compact, in field order, no
// HTML escaping.
func marshalHeader(h Header) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(h); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// summarize computes the header fields that describe the steps: distinct
// sessions, the reward summary, and the sorted distinct non-empty plugin
// hashes and adapters (nil when there are none). The mean is summed in step
// order so that Encode and Decode get the same float.
func summarize(steps []*core.Step) (sessions int, r RewardSummary, plugins, adapters []string) {
	sess := make(map[core.SessionID]struct{})
	plug := make(map[string]struct{})
	adap := make(map[string]struct{})
	var sum float64
	for _, s := range steps {
		sess[s.SessionID] = struct{}{}
		if s.Adapter != "" {
			adap[s.Adapter] = struct{}{}
		}
		if s.Reward == nil {
			continue
		}
		if v := s.Reward.Value; v != nil {
			r.Scored++
			sum += *v
			switch {
			case *v > 0:
				r.Positive++
			case *v < 0:
				r.Negative++
			}
		}
		if s.Reward.Hint != "" {
			r.Hints++
		}
		for _, sc := range s.Reward.Scores {
			if sc.Hash != "" {
				plug[sc.Hash] = struct{}{}
			}
		}
	}
	if r.Scored > 0 {
		r.Mean = sum / float64(r.Scored)
	}
	return len(sess), r, sortedKeys(plug), sortedKeys(adap)
}

func sortedKeys(m map[string]struct{}) []string {
	if len(m) == 0 {
		return nil
	}
	return slices.Sorted(maps.Keys(m))
}
