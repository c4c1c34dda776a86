package batch

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/clawmesh/clawmesh/internal/core"
)

// zstd block limits (RFC 8878 section 3.1.1.2).
const (
	blockHeaderSize = 3
	maxBlockSize    = 128 << 10
)

// sharedDecoder is built on first use and shared: DecodeAll is safe for
// concurrent use (up to GOMAXPROCS at once). It is bounded to the default
// MaxBody; a call is bounded tighter by the capacity of the buffer it
// decodes into (WithDecodeAllCapLimit), which is the declared body size.
// A caller that raises MaxBody above the default gets a decoder of its own.
var sharedDecoder = sync.OnceValues(func() (*zstd.Decoder, error) {
	return newDecoder(defaultMaxBody, 0)
})

func newDecoder(maxBody int64, concurrency int) (*zstd.Decoder, error) {
	return zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(concurrency),
		zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxMemory(uint64(maxBody)),
		// The window bounds back-references only (DecodeAll decodes into
		// the caller's buffer); clamp it to what the option accepts.
		zstd.WithDecoderMaxWindow(min(max(uint64(maxBody), zstd.MinWindowSize), 1<<40)),
		zstd.WithDecodeAllCapLimit(true),
	)
}

// DecodeHeader reads and checks a batch's framing and header without
// decompressing the body: size, magic, version, the header (valid,
// canonical, sane counts within lim) and the zstd frame's structure (its
// declared size equals the header's body_bytes, nothing truncated or
// trailing). A batch DecodeHeader accepts may still fail Decode.
func DecodeHeader(b []byte, lim Limits) (Header, error) {
	h, _, err := decodeHeader(b, lim.withDefaults())
	return h, err
}

// Decode decodes and fully verifies a batch (see the package comment for
// what it checks and in what order). It never panics, whatever b holds.
func Decode(b []byte, lim Limits) (*Batch, error) {
	lim = lim.withDefaults()
	h, frame, err := decodeHeader(b, lim)
	if err != nil {
		return nil, err
	}
	body, err := decompress(frame, h, lim)
	if err != nil {
		return nil, err
	}
	if int64(len(body)) != h.BodyBytes {
		return nil, fmt.Errorf("%w: body is %d bytes, header says %d", ErrMalformed, len(body), h.BodyBytes)
	}
	sum := sha256.Sum256(body)
	if got := hex.EncodeToString(sum[:]); got != h.BodySHA256 {
		return nil, fmt.Errorf("%w: body sha256 is %s, header says %s", ErrMalformed, got, h.BodySHA256)
	}
	steps, err := parseBody(body, h.Steps)
	if err != nil {
		return nil, err
	}
	if err := checkSummary(h, steps); err != nil {
		return nil, err
	}
	return &Batch{Header: h, Steps: steps}, nil
}

// decodeHeader checks everything up to the body's content and returns the
// header and the zstd frame.
func decodeHeader(b []byte, lim Limits) (Header, []byte, error) {
	var h Header
	if int64(len(b)) > lim.MaxBytes {
		return h, nil, fmt.Errorf("%w: batch is %d bytes, limit %d", ErrTooLarge, len(b), lim.MaxBytes)
	}
	if len(b) < len(magic)+1 {
		if bytes.HasPrefix([]byte(magic), b) {
			return h, nil, fmt.Errorf("%w: %d bytes, shorter than the magic and version", ErrTruncated, len(b))
		}
	}
	if !bytes.HasPrefix(b, []byte(magic)) {
		return h, nil, fmt.Errorf("%w: bad magic %q, want %q", ErrMalformed, b[:min(len(b), len(magic))], magic)
	}
	if v := b[len(magic)]; v != formatVersion {
		return h, nil, fmt.Errorf("%w: format version %d, want %d", ErrVersion, v, formatVersion)
	}
	rest := b[len(magic)+1:]
	hlen, n := binary.Uvarint(rest)
	switch {
	case n == 0:
		return h, nil, fmt.Errorf("%w: input ends inside the header length", ErrTruncated)
	case n < 0:
		return h, nil, fmt.Errorf("%w: header length overflows 64 bits", ErrMalformed)
	case n != uvarintLen(hlen):
		return h, nil, fmt.Errorf("%w: header length %d is not minimally encoded (%d bytes)", ErrMalformed, hlen, n)
	case hlen > uint64(lim.MaxHeader):
		return h, nil, fmt.Errorf("%w: header JSON is %d bytes, limit %d", ErrTooLarge, hlen, lim.MaxHeader)
	case hlen > uint64(len(rest)-n):
		return h, nil, fmt.Errorf("%w: header JSON is %d bytes, input has %d after its length", ErrTruncated, hlen, len(rest)-n)
	}
	hj := rest[n : n+int(hlen)]
	frame := rest[n+int(hlen):]

	dec := json.NewDecoder(bytes.NewReader(hj))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&h); err != nil {
		return Header{}, nil, fmt.Errorf("%w: header JSON: %v", ErrMalformed, err)
	}
	if h.Schema != Schema {
		return Header{}, nil, fmt.Errorf("%w: header schema %q, want %q", ErrVersion, h.Schema, Schema)
	}
	if h.StepSchema != core.SchemaVersion {
		return Header{}, nil, fmt.Errorf("%w: header step_schema %q, want %q", ErrVersion, h.StepSchema, core.SchemaVersion)
	}
	if canon, err := marshalHeader(h); err != nil || !bytes.Equal(canon, hj) {
		return Header{}, nil, fmt.Errorf("%w: header JSON is not in canonical form (compact, in field order, nothing after it)", ErrMalformed)
	}
	if h.Created.Location() != time.UTC {
		return Header{}, nil, fmt.Errorf("%w: header created %s is not in UTC", ErrMalformed, h.Created.Format(time.RFC3339Nano))
	}
	if err := checkHeader(h, lim); err != nil {
		return Header{}, nil, err
	}
	if err := checkFrame(frame, h, lim); err != nil {
		return Header{}, nil, err
	}
	return h, frame, nil
}

func uvarintLen(v uint64) int {
	var buf [binary.MaxVarintLen64]byte
	return binary.PutUvarint(buf[:], v)
}

// checkHeader checks that the header's numbers are possible and within lim.
func checkHeader(h Header, lim Limits) error {
	r := h.Rewards
	switch {
	case h.Steps < 1:
		return fmt.Errorf("%w: header steps = %d, want at least 1", ErrMalformed, h.Steps)
	case h.Steps > lim.MaxSteps:
		return fmt.Errorf("%w: header steps = %d, limit %d", ErrTooLarge, h.Steps, lim.MaxSteps)
	case h.BodyBytes < int64(h.Steps):
		return fmt.Errorf("%w: header body_bytes = %d, fewer than its %d steps need", ErrMalformed, h.BodyBytes, h.Steps)
	case h.BodyBytes > lim.MaxBody:
		return fmt.Errorf("%w: header body_bytes = %d, limit %d", ErrTooLarge, h.BodyBytes, lim.MaxBody)
	case !isSHA256Hex(h.BodySHA256):
		return fmt.Errorf("%w: header body_sha256 %q is not 64 lower-case hex digits", ErrMalformed, h.BodySHA256)
	case h.Sessions < 1 || h.Sessions > h.Steps:
		return fmt.Errorf("%w: header sessions = %d, want 1..%d (steps)", ErrMalformed, h.Sessions, h.Steps)
	case r.Scored < 0 || r.Scored > h.Steps:
		return fmt.Errorf("%w: header rewards.scored = %d, want 0..%d (steps)", ErrMalformed, r.Scored, h.Steps)
	case r.Positive < 0 || r.Negative < 0 || r.Positive+r.Negative > r.Scored:
		return fmt.Errorf("%w: header rewards: positive %d + negative %d must be within scored %d", ErrMalformed, r.Positive, r.Negative, r.Scored)
	case r.Hints < 0 || r.Hints > h.Steps:
		return fmt.Errorf("%w: header rewards.hints = %d, want 0..%d (steps)", ErrMalformed, r.Hints, h.Steps)
	case math.IsNaN(r.Mean) || r.Mean < -1 || r.Mean > 1 || (r.Scored == 0 && r.Mean != 0):
		return fmt.Errorf("%w: header rewards.mean = %v with %d scored", ErrMalformed, r.Mean, r.Scored)
	case len(h.Adapters) > h.Steps:
		return fmt.Errorf("%w: header lists %d adapters for %d steps", ErrMalformed, len(h.Adapters), h.Steps)
	}
	if err := checkSortedSet("plugins", h.Plugins); err != nil {
		return err
	}
	return checkSortedSet("adapters", h.Adapters)
}

func isSHA256Hex(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// checkSortedSet checks that list is sorted, without duplicates or empty
// entries.
func checkSortedSet(field string, list []string) error {
	for i, s := range list {
		if s == "" {
			return fmt.Errorf("%w: header %s[%d] is empty", ErrMalformed, field, i)
		}
		if i > 0 && list[i-1] >= s {
			return fmt.Errorf("%w: header %s not sorted and distinct at %d (%q after %q)", ErrMalformed, field, i, s, list[i-1])
		}
	}
	return nil
}

// checkFrame checks the structure of the zstd frame without decompressing
// it: one frame, content size declared and equal to the header's, no
// dictionary, every block header and block present, nothing after the
// frame, and raw and RLE blocks (whose sizes are known without decoding)
// within the declared size. The zstd package decodes concatenated and
// skippable frames silently and has no call that says where a frame ends,
// so this walks the block headers itself (RFC 8878 section 3.1.1).
func checkFrame(frame []byte, h Header, lim Limits) error {
	if len(frame) == 0 {
		return fmt.Errorf("%w: input ends before the body frame", ErrTruncated)
	}
	var zh zstd.Header
	if err := zh.Decode(frame); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%w: input ends inside the body frame header", ErrTruncated)
		}
		return fmt.Errorf("%w: body frame header: %v", ErrMalformed, err)
	}
	switch {
	case zh.Skippable:
		return fmt.Errorf("%w: body is a skippable frame", ErrMalformed)
	case zh.DictionaryID != 0:
		return fmt.Errorf("%w: body frame uses dictionary %d, none is allowed", ErrMalformed, zh.DictionaryID)
	case !zh.HasFCS:
		return fmt.Errorf("%w: body frame does not declare its content size", ErrMalformed)
	case zh.FrameContentSize > uint64(lim.MaxBody):
		return fmt.Errorf("%w: body frame declares %d bytes, limit %d", ErrTooLarge, zh.FrameContentSize, lim.MaxBody)
	case zh.FrameContentSize != uint64(h.BodyBytes):
		return fmt.Errorf("%w: body frame declares %d bytes, header body_bytes = %d", ErrMalformed, zh.FrameContentSize, h.BodyBytes)
	}
	pos := zh.HeaderSize
	var known, most uint64 // bytes raw and RLE blocks make; most all blocks can make
	for block := 0; ; block++ {
		if len(frame)-pos < blockHeaderSize {
			return fmt.Errorf("%w: input ends inside the header of body block %d", ErrTruncated, block)
		}
		bh := uint32(frame[pos]) | uint32(frame[pos+1])<<8 | uint32(frame[pos+2])<<16
		pos += blockHeaderSize
		last, typ, size := bh&1 == 1, (bh>>1)&3, int(bh>>3)
		if size > maxBlockSize {
			return fmt.Errorf("%w: body block %d has size %d, over the %d maximum", ErrMalformed, block, size, maxBlockSize)
		}
		n := size
		switch typ {
		case 0: // raw
			known += uint64(size)
			most += uint64(size)
		case 1: // RLE: one byte, repeated size times
			n = 1
			known += uint64(size)
			most += uint64(size)
		case 2: // compressed
			most += maxBlockSize
		default:
			return fmt.Errorf("%w: body block %d has the reserved block type", ErrMalformed, block)
		}
		if known > zh.FrameContentSize {
			return fmt.Errorf("%w: body blocks make more than the %d bytes the frame declares", ErrTooLarge, zh.FrameContentSize)
		}
		if len(frame)-pos < n {
			return fmt.Errorf("%w: input ends inside body block %d (%d of %d bytes)", ErrTruncated, block, len(frame)-pos, n)
		}
		pos += n
		if last {
			break
		}
	}
	if most < zh.FrameContentSize {
		return fmt.Errorf("%w: body blocks can make at most %d bytes, the frame declares %d", ErrMalformed, most, zh.FrameContentSize)
	}
	if zh.HasCheckSum {
		if len(frame)-pos < 4 {
			return fmt.Errorf("%w: input ends inside the body frame checksum", ErrTruncated)
		}
		pos += 4
	}
	if pos != len(frame) {
		return fmt.Errorf("%w: %d trailing bytes after the body frame", ErrMalformed, len(frame)-pos)
	}
	return nil
}

// decompress decodes the frame checkFrame accepted into a buffer of the
// declared size (plus room for one block, so an overrun is seen without a
// reallocation); the decoder may not grow it.
func decompress(frame []byte, h Header, lim Limits) ([]byte, error) {
	var zdec *zstd.Decoder
	var err error
	if lim.MaxBody <= defaultMaxBody {
		zdec, err = sharedDecoder()
	} else {
		zdec, err = newDecoder(lim.MaxBody, 1)
		if zdec != nil {
			defer zdec.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("batch: zstd decoder: %w", err)
	}
	body, err := zdec.DecodeAll(frame, make([]byte, 0, h.BodyBytes+maxBlockSize))
	switch {
	case err == nil:
		return body, nil
	case errors.Is(err, zstd.ErrDecoderSizeExceeded), errors.Is(err, zstd.ErrFrameSizeExceeded),
		errors.Is(err, zstd.ErrWindowSizeExceeded):
		return nil, fmt.Errorf("%w: body decompresses past its declared %d bytes: %v", ErrTooLarge, h.BodyBytes, err)
	default:
		return nil, fmt.Errorf("%w: body frame: %v", ErrMalformed, err)
	}
}

// parseBody reads the JSONL body: want lines, each a canonical, valid step
// with a new id.
func parseBody(body []byte, want int) ([]*core.Step, error) {
	if len(body) == 0 || body[len(body)-1] != '\n' {
		return nil, fmt.Errorf("%w: body does not end in a newline", ErrMalformed)
	}
	steps := make([]*core.Step, 0, want)
	seen := make(map[core.StepID]int, want)
	var canon bytes.Buffer
	lw := newLineWriter(&canon)
	for line := 1; len(body) > 0; line++ {
		if line > want {
			return nil, fmt.Errorf("%w: header says %d steps, body has more lines", ErrMalformed, want)
		}
		i := bytes.IndexByte(body, '\n')
		text := body[:i+1] // with its newline
		body = body[i+1:]

		var es core.ExportedStep
		if err := json.Unmarshal(text, &es); err != nil {
			return nil, fmt.Errorf("%w: step line %d: %v", ErrMalformed, line, err)
		}
		if es.Schema != core.SchemaVersion {
			return nil, fmt.Errorf("%w: step line %d: schema %q, want %q", ErrVersion, line, es.Schema, core.SchemaVersion)
		}
		s := &es.Step
		if err := s.Validate(); err != nil {
			return nil, fmt.Errorf("%w: step line %d: %v", ErrMalformed, line, err)
		}
		if first, dup := seen[s.ID]; dup {
			return nil, fmt.Errorf("%w: step line %d: duplicate step id %q (first on line %d)", ErrMalformed, line, s.ID, first)
		}
		seen[s.ID] = line
		canon.Reset()
		if err := lw.write(s); err != nil || !bytes.Equal(canon.Bytes(), text) {
			return nil, fmt.Errorf("%w: step line %d (id %q): %s", ErrMalformed, line, s.ID, whyNotCanonical(text))
		}
		steps = append(steps, s)
	}
	if len(steps) != want {
		return nil, fmt.Errorf("%w: header says %d steps, body has %d lines", ErrMalformed, want, len(steps))
	}
	return steps, nil
}

// whyNotCanonical explains a line that parses but is not in canonical form:
// an unknown field if it has one, else the form itself.
func whyNotCanonical(text []byte) string {
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.DisallowUnknownFields()
	var es core.ExportedStep
	if err := dec.Decode(&es); err != nil {
		return err.Error()
	}
	return "not in canonical form (as encoding/json writes it: compact, field order, no HTML escaping)"
}

// checkSummary checks the header's summary fields against the steps.
func checkSummary(h Header, steps []*core.Step) error {
	sessions, rewards, plugins, adapters := summarize(steps)
	switch {
	case h.Sessions != sessions:
		return fmt.Errorf("%w: header sessions = %d, steps have %d", ErrMalformed, h.Sessions, sessions)
	case h.Rewards != rewards:
		return fmt.Errorf("%w: header rewards = %+v, steps give %+v", ErrMalformed, h.Rewards, rewards)
	case !slices.Equal(h.Plugins, plugins):
		return fmt.Errorf("%w: header plugins = %q, steps give %q", ErrMalformed, h.Plugins, plugins)
	case !slices.Equal(h.Adapters, adapters):
		return fmt.Errorf("%w: header adapters = %q, steps give %q", ErrMalformed, h.Adapters, adapters)
	}
	return nil
}
