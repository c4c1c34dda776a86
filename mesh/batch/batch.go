// Package batch is the wire format of a batch of scrubbed steps: the bytes a
// device sends to trainers, and the only thing of its data that leaves it.
// It owns encoding a batch, decoding and verifying one that arrived from a
// peer, and the batch's content address (ID). It does no I/O and holds no
// state beyond a lazily built, concurrency-safe zstd encoder and decoder.
//
// # Format (clawmesh.batch/v1)
//
// A batch is, in order:
//
//  1. magic: the 8 bytes "CMBATCH\x00", then one format version byte (1);
//  2. the length of the header JSON as a minimal uvarint
//     (encoding/binary), then the header JSON: a Header, compact UTF-8,
//     exactly as Encode writes it (field order of Header, no HTML
//     escaping, Created in UTC);
//  3. the rest, to the last byte: exactly one zstd frame (RFC 8878) that
//     declares its content size, uses no dictionary and is followed by
//     nothing. Its content, the body, is JSONL: one core.ExportedStep per
//     line ({"schema":"clawmesh.step/v1", ...step}), each line exactly as
//     encoding/json writes it with HTML escaping off (the same lines
//     `clawmesh pool export` writes) and each ending in "\n".
//
// The header describes the body without decompressing it (DecodeHeader):
// how many steps and sessions, a summary of the rewards, the reward plugins
// and adapters involved, and the body's length and sha256. Decode checks
// every one of those claims against the steps, so a header cannot lie about
// its body, and it checks that the encoding is canonical (header and step
// lines are what Encode would write for them), so one batch has one header
// and one body. Only the zstd frame may differ between encoders that
// produce the same batch; Encode itself is deterministic (same input, same
// bytes) for a given version of github.com/klauspost/compress.
//
// The ID of a batch is the hex sha256 of all its encoded bytes.
//
// # Decoding peer bytes
//
// Decode refuses, before any work of a size the input does not justify: an
// input over Limits.MaxBytes; a bad magic or unknown version; a header over
// Limits.MaxHeader or past the end of the input; header JSON that is
// invalid, has unknown fields, names another schema or is not canonical;
// a header whose counts are impossible (steps outside 1..MaxSteps, a body
// over MaxBody, ...); a zstd frame that is truncated, does not declare a
// content size equal to the header's body_bytes, has trailing bytes, or
// whose raw and RLE blocks alone already make more than it declares. Only
// then does it decompress, into a buffer of the declared size that the
// decoder may not grow (zstd.WithDecodeAllCapLimit), so a zip bomb fails
// with ErrTooLarge after allocating at most the declared size plus one
// 128 KiB block. Then it checks the body's length and sha256, each line
// (JSON, schema tag, canonical form, (*core.Step).Validate, unique id), the
// number of lines, and the header's summary against the steps.
//
// Every error Decode returns wraps exactly one of ErrMalformed, ErrTooLarge,
// ErrTruncated and ErrVersion (Verify adds ErrHashMismatch) and says what
// was wrong: which step line, which field, what was expected and what came.
// See RATIONALE.md for the choices behind the format.
package batch

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
)

// Schema names the format and its version; it is the header's "schema".
const Schema = "clawmesh.batch/v1"

// magic opens every batch; formatVersion follows it.
const (
	magic         = "CMBATCH\x00"
	formatVersion = 1
)

// Errors. Every error from Decode, DecodeHeader and Verify wraps exactly one
// of them; Encode's wrap ErrMalformed (input that cannot make a valid batch)
// or ErrTooLarge (a batch the default Limits would refuse).
var (
	// ErrMalformed: the bytes are not a valid batch (or the input to Encode
	// cannot make one).
	ErrMalformed = errors.New("batch: malformed")
	// ErrTooLarge: a size is over its limit (Limits), declared or real.
	ErrTooLarge = errors.New("batch: too large")
	// ErrTruncated: the input ends before the batch does.
	ErrTruncated = errors.New("batch: truncated")
	// ErrVersion: a format version or schema this package does not speak.
	ErrVersion = errors.New("batch: unknown version")
	// ErrHashMismatch: the bytes do not hash to the expected id.
	ErrHashMismatch = errors.New("batch: hash mismatch")
)

// Meta is what the producer says about a batch beyond its steps.
type Meta struct {
	// Created is when the batch was made; the producer already rounded it
	// to the hour. Encode writes it in UTC.
	Created time.Time
	// Policy is a short digest naming the sharing policy that selected and
	// scrubbed the steps.
	Policy string
}

// Header is the batch's self-description, readable without decompressing the
// body (DecodeHeader). Decode checks every field against the body.
type Header struct {
	Schema     string        `json:"schema"`      // Schema
	StepSchema string        `json:"step_schema"` // core.SchemaVersion
	Created    time.Time     `json:"created"`     // Meta.Created, UTC
	Policy     string        `json:"policy,omitempty"`
	Steps      int           `json:"steps"`    // number of steps (body lines)
	Sessions   int           `json:"sessions"` // distinct session ids
	Rewards    RewardSummary `json:"rewards"`
	// Plugins are the distinct non-empty reward plugin hashes (Score.Hash)
	// over all steps, sorted.
	Plugins []string `json:"plugins,omitempty"`
	// Adapters are the distinct non-empty Step.Adapter values, sorted.
	Adapters   []string `json:"adapters,omitempty"`
	BodyBytes  int64    `json:"body_bytes"`  // length of the decompressed body
	BodySHA256 string   `json:"body_sha256"` // hex sha256 of the decompressed body
}

// RewardSummary sums up the steps' combined rewards (Step.Reward).
type RewardSummary struct {
	Scored   int     `json:"scored"`   // steps with a non-nil Reward.Value
	Positive int     `json:"positive"` // value > 0
	Negative int     `json:"negative"` // value < 0
	Mean     float64 `json:"mean"`     // mean of the values in step order (0 if none)
	Hints    int     `json:"hints"`    // steps with a non-empty Reward.Hint
}

// Batch is a decoded, verified batch.
type Batch struct {
	Header Header
	Steps  []*core.Step // in the order they were encoded
}

// Limits bound what Decode accepts; the zero value of each field (or a
// negative one) means its default. Encode refuses to make a batch that the
// default Limits refuse.
type Limits struct {
	MaxBytes  int64 // encoded size; default 32 MiB
	MaxBody   int64 // decompressed body; default 256 MiB
	MaxSteps  int   // steps in a batch; default 4096
	MaxHeader int   // header JSON; default 64 KiB
}

const (
	defaultMaxBytes  = 32 << 20
	defaultMaxBody   = 256 << 20
	defaultMaxSteps  = 4096
	defaultMaxHeader = 64 << 10
)

// withDefaults returns l with each zero (or negative) field set to its
// default.
func (l Limits) withDefaults() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = defaultMaxBytes
	}
	if l.MaxBody <= 0 {
		l.MaxBody = defaultMaxBody
	}
	if l.MaxSteps <= 0 {
		l.MaxSteps = defaultMaxSteps
	}
	if l.MaxHeader <= 0 {
		l.MaxHeader = defaultMaxHeader
	}
	return l
}

// ID is the batch's content address: the hex sha256 of its encoded bytes.
func ID(b []byte) core.BatchID {
	sum := sha256.Sum256(b)
	return core.BatchID(hex.EncodeToString(sum[:]))
}

// Verify checks that b is the batch named id (else ErrHashMismatch), then
// decodes it as Decode does.
func Verify(b []byte, id core.BatchID, lim Limits) (*Batch, error) {
	if got := ID(b); got != id {
		return nil, fmt.Errorf("%w: want id %q, bytes hash to %s", ErrHashMismatch, id, got)
	}
	return Decode(b, lim)
}
