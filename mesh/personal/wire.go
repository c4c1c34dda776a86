package personal

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
)

// Protocol is the personal adapter protocol on the mesh host's streams.
const Protocol = "/clawmesh/personal/1"

// The two files of a PEFT adapter directory.
const (
	ConfigFile  = "adapter_config.json"
	WeightsFile = "adapter_model.safetensors"
)

// Limits bound a job on the wire; the zero value of each field (or a
// negative one) means its default. A device refuses to send a job over
// them, a trainer refuses one declared over them before it reads it, and
// a device refuses an adapter over them before it reads it.
type Limits struct {
	// MaxSteps bounds the steps, and the held-back steps, of a job (each;
	// default 4096).
	MaxSteps int
	// MaxStepBytes bounds the encoded steps, and the encoded held-back
	// steps (each a mesh/batch encoding; default 32 MiB).
	MaxStepBytes int64
	// MaxConfig bounds an adapter's adapter_config.json (default 64 KiB)
	// and MaxWeights its adapter_model.safetensors (default 256 MiB).
	MaxConfig  int64
	MaxWeights int64
}

// Defaults of Limits.
const (
	DefaultMaxSteps     = 4096
	DefaultMaxStepBytes = 32 << 20
	DefaultMaxConfig    = 64 << 10
	DefaultMaxWeights   = 256 << 20
)

func (l Limits) withDefaults() Limits {
	if l.MaxSteps <= 0 {
		l.MaxSteps = DefaultMaxSteps
	}
	if l.MaxStepBytes <= 0 {
		l.MaxStepBytes = DefaultMaxStepBytes
	}
	if l.MaxConfig <= 0 {
		l.MaxConfig = DefaultMaxConfig
	}
	if l.MaxWeights <= 0 {
		l.MaxWeights = DefaultMaxWeights
	}
	return l
}

// Errors. A refusal a trainer sends maps to one of them (statusErr), so
// a device tells them apart with errors.Is.
var (
	// ErrMessage: a peer sent bytes that do not follow the protocol.
	ErrMessage = errors.New("personal: bad message")
	// ErrTooLarge: a size is over its limit (Limits).
	ErrTooLarge = errors.New("personal: too large")
	// ErrRefused: the trainer does not train for this peer (it is not
	// one of the mesh's member devices, or the request named another
	// device).
	ErrRefused = errors.New("personal: refused")
	// ErrBusy: the trainer runs as many jobs as it takes, one of this
	// device's already, or this device's jobs of the last hour; try later.
	ErrBusy = errors.New("personal: trainer busy")
	// ErrUnknownVersion: the trainer does not hold the shared version the
	// job names (a trainer's handler wraps it to say so).
	ErrUnknownVersion = errors.New("personal: unknown shared version")
	// ErrFailed: the training failed on the trainer.
	ErrFailed = errors.New("personal: training failed")
	// ErrNoTrainer: none of the trainers the device trusts is an admitted
	// trainer of the mesh now.
	ErrNoTrainer = errors.New("personal: no trusted trainer reachable")
	// ErrSignature: a reply that is not the trainer's answer to this job:
	// its signature does not hold for this device, this job's nonce, the
	// request sent and the adapter received.
	ErrSignature = errors.New("personal: reply not signed for this job")
)

// Statuses of a reply: the one place the wire's words map to sentinels.
const (
	statusAccepted   = "accepted" // the request's header is taken: send the rest
	statusOK         = "ok"       // the adapter follows
	statusRefused    = "refused"
	statusBusy       = "busy"
	statusTooLarge   = "too_large"
	statusBad        = "bad_request"
	statusUnknownVer = "unknown_version"
	statusFailed     = "failed"
)

// statusErr is the error a refusal is to the device.
func statusErr(status, msg string) error {
	var e error
	switch status {
	case statusRefused:
		e = ErrRefused
	case statusBusy:
		e = ErrBusy
	case statusTooLarge:
		e = ErrTooLarge
	case statusBad:
		e = ErrMessage
	case statusUnknownVer:
		e = ErrUnknownVersion
	case statusFailed:
		e = ErrFailed
	default:
		return fmt.Errorf("%w: reply status %q", ErrMessage, clip(status, 40))
	}
	// The trainer's message may already say what the status says.
	msg = strings.TrimPrefix(strings.TrimPrefix(msg, e.Error()), ": ")
	if msg == "" {
		return e
	}
	return fmt.Errorf("%w: %s", e, clip(msg, maxError))
}

// errStatus is the status a trainer answers for a handler's error.
func errStatus(err error) string {
	switch {
	case errors.Is(err, ErrUnknownVersion):
		return statusUnknownVer
	case errors.Is(err, ErrTooLarge):
		return statusTooLarge
	case errors.Is(err, ErrRefused):
		return statusRefused
	case errors.Is(err, ErrBusy):
		return statusBusy
	}
	return statusFailed
}

// request is the header of a job: who asks, the job's nonce, what it
// trains on, and the sizes of the four parts that follow it, in order:
// the steps and the held-back steps (each a mesh/batch encoding; 0 bytes:
// none), then the previous adapter's config and weights (0 bytes each:
// none, a fresh adapter).
type request struct {
	// Device is the peer the job is for: the one that asks, no other.
	Device string `json:"device"`
	// Nonce is 32 random bytes, in hex, that the trainer's signature over
	// its reply binds.
	Nonce         string `json:"nonce"`
	SharedVersion string `json:"shared_version,omitempty"`
	Seed          uint64 `json:"seed,omitempty"`
	Steps         int64  `json:"steps_bytes"`
	HeldBack      int64  `json:"held_back_bytes,omitempty"`
	Config        int64  `json:"config_bytes,omitempty"`
	Weights       int64  `json:"weights_bytes,omitempty"`
}

// reply answers a request twice: once its header was read (accepted, or a
// refusal), then once the job ran (ok with the adapter's sizes, the
// result and the signature, followed by the adapter's config and weights;
// or a refusal).
type reply struct {
	Status string               `json:"status"`
	Error  string               `json:"error,omitempty"`
	Result *core.PersonalResult `json:"result,omitempty"`
	// Config and Weights are the sizes of the adapter's two files that
	// follow.
	Config  int64 `json:"config_bytes,omitempty"`
	Weights int64 `json:"weights_bytes,omitempty"`
	// Sig is the trainer's signature (hex) of signedReply.
	Sig string `json:"sig,omitempty"`
}

const (
	// maxMsg bounds a request's or a reply's header.
	maxMsg = 16 << 10
	// maxError bounds the error text a reply carries.
	maxError = 512
	// maxPeerID and maxVersion bound a peer id and a version's name.
	maxPeerID  = 128
	maxVersion = 64
	nonceSize  = 32
)

// check checks a request's fields against lim. Its errors wrap ErrMessage
// or ErrTooLarge.
func (r *request) check(lim Limits) error {
	lim = lim.withDefaults()
	switch {
	case r.Device == "" || len(r.Device) > maxPeerID:
		return fmt.Errorf("%w: device %q", ErrMessage, clip(r.Device, 40))
	case !validNonce(r.Nonce):
		return fmt.Errorf("%w: the nonce is not %d bytes in lower-case hex", ErrMessage, nonceSize)
	case r.SharedVersion != "" && !ValidVersion(r.SharedVersion):
		return fmt.Errorf("%w: shared version %q", ErrMessage, clip(r.SharedVersion, 40))
	case r.Steps <= 0 || r.HeldBack < 0 || r.Config < 0 || r.Weights < 0:
		return fmt.Errorf("%w: sizes %d, %d, %d, %d (steps are needed; none negative)", ErrMessage, r.Steps, r.HeldBack, r.Config, r.Weights)
	case (r.Config == 0) != (r.Weights == 0):
		return fmt.Errorf("%w: an adapter needs both its config (%d bytes) and its weights (%d bytes)", ErrMessage, r.Config, r.Weights)
	case r.Steps > lim.MaxStepBytes || r.HeldBack > lim.MaxStepBytes:
		return fmt.Errorf("%w: steps of %d and %d bytes, limit %d", ErrTooLarge, r.Steps, r.HeldBack, lim.MaxStepBytes)
	case r.Config > lim.MaxConfig:
		return fmt.Errorf("%w: an adapter config of %d bytes, limit %d", ErrTooLarge, r.Config, lim.MaxConfig)
	case r.Weights > lim.MaxWeights:
		return fmt.Errorf("%w: adapter weights of %d bytes, limit %d", ErrTooLarge, r.Weights, lim.MaxWeights)
	}
	return nil
}

// checkOK checks the sizes and the result of an ok reply against lim.
func (r *reply) checkOK(lim Limits) error {
	lim = lim.withDefaults()
	switch {
	case r.Result == nil || !validResult(*r.Result):
		return fmt.Errorf("%w: an ok reply with no valid result", ErrMessage)
	case r.Config <= 0 || r.Weights <= 0:
		return fmt.Errorf("%w: an adapter of %d and %d bytes", ErrMessage, r.Config, r.Weights)
	case r.Config > lim.MaxConfig:
		return fmt.Errorf("%w: an adapter config of %d bytes, limit %d", ErrTooLarge, r.Config, lim.MaxConfig)
	case r.Weights > lim.MaxWeights:
		return fmt.Errorf("%w: adapter weights of %d bytes, limit %d", ErrTooLarge, r.Weights, lim.MaxWeights)
	case len(r.Sig) != 2*64:
		return fmt.Errorf("%w: the reply's signature is missing or malformed", ErrSignature)
	}
	return nil
}

// ValidVersion reports a shared version's name as the protocol carries
// it: 1 to 64 letters, digits, '.', '_' or '-' ("v12").
func ValidVersion(v string) bool {
	if v == "" || len(v) > maxVersion {
		return false
	}
	for _, c := range []byte(v) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func validNonce(s string) bool {
	if len(s) != 2*nonceSize {
		return false
	}
	for _, c := range []byte(s) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// validResult reports a result whose numbers are possible: counts not
// negative, scores -1 or within [0, 1], a finite time not negative.
func validResult(r core.PersonalResult) bool {
	score := func(v float64) bool { return v == -1 || v >= 0 && v <= 1 }
	return r.Trained >= 0 && r.HeldBack >= 0 && score(r.ScoreBefore) && score(r.ScoreAfter) &&
		r.Seconds >= 0 && !math.IsInf(r.Seconds, 0) && !math.IsNaN(r.Seconds)
}

// signDomain starts every signed reply, so that the signature means this
// and nothing else the trainer's key signs.
const signDomain = "clawmesh personal reply/1\x00"

// signedReply is what a trainer signs over its reply to one job: itself,
// the device the job is for, the job's nonce, the digest of every byte
// the device sent (the request), the SHA-256 of the adapter's config and
// weights, and the result.
func signedReply(trainer, device mesh.PeerID, nonce string, request, config, weights [sha256.Size]byte, res core.PersonalResult) []byte {
	b := []byte(signDomain)
	for _, s := range []string{string(trainer), string(device), nonce} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = append(b, request[:]...)
	b = append(b, config[:]...)
	b = append(b, weights[:]...)
	b = binary.AppendUvarint(b, uint64(res.Trained))
	b = binary.AppendUvarint(b, uint64(res.HeldBack))
	for _, f := range []float64{res.ScoreBefore, res.ScoreAfter, res.Seconds} {
		b = binary.BigEndian.AppendUint64(b, math.Float64bits(f))
	}
	return b
}

// encodeMsg frames v: its JSON's length as a uvarint, then the JSON.
func encodeMsg(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if len(b) > maxMsg {
		return nil, fmt.Errorf("%w: a message of %d bytes to send, over %d", ErrTooLarge, len(b), maxMsg)
	}
	out := binary.AppendUvarint(make([]byte, 0, len(b)+binary.MaxVarintLen32), uint64(len(b)))
	return append(out, b...), nil
}

// readMsg reads one message encodeMsg framed into v, refusing one over
// maxMsg before reading it, and returns the frame as it came (its length
// only in its shortest form, as encodeMsg writes it).
func readMsg(r *bufio.Reader, v any) ([]byte, error) {
	var frame []byte
	var n uint64
	for i := 0; ; i++ {
		c, err := r.ReadByte()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil, io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("%w: length: %v", ErrMessage, err)
		}
		frame = append(frame, c)
		n |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			if i > 0 && c == 0 {
				return nil, fmt.Errorf("%w: a length not in its shortest form", ErrMessage)
			}
			break
		}
		if n > maxMsg || i == 2 {
			return nil, fmt.Errorf("%w: a message of more than %d bytes", ErrTooLarge, maxMsg)
		}
	}
	if n > maxMsg {
		return nil, fmt.Errorf("%w: a message of %d bytes, over %d", ErrTooLarge, n, maxMsg)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMessage, err)
	}
	if err := decodeJSON(b, v); err != nil {
		return nil, err
	}
	return append(frame, b...), nil
}

// decodeJSON decodes exactly one JSON value with no unknown fields.
func decodeJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %v", ErrMessage, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: trailing data", ErrMessage)
	}
	return nil
}

// checkConfig checks that b is an adapter config: a JSON object.
func checkConfig(b []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil || m == nil {
		return fmt.Errorf("%w: %s is not a JSON object", ErrMessage, ConfigFile)
	}
	return nil
}

// maxSafetensorsHeader bounds the JSON header of a safetensors file read
// to check it (a LoRA adapter's is some 100 bytes a tensor).
const maxSafetensorsHeader = 16 << 20

// checkWeights checks that r, of size bytes, reads as a safetensors file:
// an 8-byte little-endian length, then a JSON object of that length
// within the file. It does not check the tensors (the trainer's engine
// and the device's stacking read them).
func checkWeights(r io.ReaderAt, size int64) error {
	var lb [8]byte
	if size < 8+2 {
		return fmt.Errorf("%w: %s of %d bytes", ErrMessage, WeightsFile, size)
	}
	if _, err := r.ReadAt(lb[:], 0); err != nil {
		return err
	}
	n := binary.LittleEndian.Uint64(lb[:])
	if n < 2 || n > uint64(size-8) || n > maxSafetensorsHeader {
		return fmt.Errorf("%w: %s declares a header of %d bytes in %d", ErrMessage, WeightsFile, n, size)
	}
	h := make([]byte, n)
	if _, err := r.ReadAt(h, 8); err != nil {
		return err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(h, &m); err != nil || m == nil {
		return fmt.Errorf("%w: the header of %s is not a JSON object", ErrMessage, WeightsFile)
	}
	return nil
}

func hexSig(sig []byte) string { return hex.EncodeToString(sig) }

// clip cuts s to n bytes at most, marking the cut, and makes it one line.
func clip(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > n {
		return strings.ToValidUTF8(s[:n], "") + "..."
	}
	return s
}
