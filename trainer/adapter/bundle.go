package adapter

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
)

// Sentinel errors.
var (
	// ErrInvalid: a bundle, a delta or a contribution is malformed.
	ErrInvalid = errors.New("adapter: invalid")
	// ErrTooLarge: something is over a Limits bound.
	ErrTooLarge = errors.New("adapter: over limit")
	// ErrMismatch: two bundles or deltas that must agree (tensor names,
	// shapes, LoRA rank and alpha, parent) do not.
	ErrMismatch = errors.New("adapter: mismatch")
)

// The two files of a PEFT adapter directory.
const (
	ConfigFile  = "adapter_config.json"
	WeightsFile = "adapter_model.safetensors"
)

// Limits bound what Read and UnmarshalDelta accept. The zero value means
// the defaults; negative fields are refused.
type Limits struct {
	// MaxParams bounds the total number of elements over all tensors
	// (default 1<<28, 1 GiB as float32).
	MaxParams int64
	// MaxTensors bounds the number of tensors (default 65536).
	MaxTensors int
	// MaxHeaderBytes bounds a safetensors JSON header (default 16 MiB).
	MaxHeaderBytes int
	// MaxConfigBytes bounds adapter_config.json (default 1 MiB).
	MaxConfigBytes int
}

// Limits defaults.
const (
	DefaultMaxParams      = 1 << 28
	DefaultMaxTensors     = 1 << 16
	DefaultMaxHeaderBytes = 16 << 20
	DefaultMaxConfigBytes = 1 << 20
)

func (l Limits) withDefaults() (Limits, error) {
	if l.MaxParams < 0 || l.MaxTensors < 0 || l.MaxHeaderBytes < 0 || l.MaxConfigBytes < 0 {
		return l, fmt.Errorf("%w: negative limit in %+v", ErrInvalid, l)
	}
	if l.MaxParams == 0 {
		l.MaxParams = DefaultMaxParams
	}
	if l.MaxTensors == 0 {
		l.MaxTensors = DefaultMaxTensors
	}
	if l.MaxHeaderBytes == 0 {
		l.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if l.MaxConfigBytes == 0 {
		l.MaxConfigBytes = DefaultMaxConfigBytes
	}
	return l, nil
}

// maxWeightsBytes bounds a safetensors file within l: the length prefix, the
// header and MaxParams elements of at most 4 bytes.
func (l Limits) maxWeightsBytes() int64 {
	return 8 + int64(l.MaxHeaderBytes) + 4*l.MaxParams
}

// Tensor is one named tensor in float32, row-major.
type Tensor struct {
	Name  string
	Shape []int
	Data  []float32
}

// Bundle is a LoRA adapter in PEFT format held in memory: the
// adapter_config.json bytes as they are, and the tensors sorted by name.
type Bundle struct {
	Config  []byte
	Tensors []Tensor
}

// peftConfig is the part of adapter_config.json the package checks: a delta
// only makes sense between adapters of the same rank and scale.
type peftConfig struct {
	PeftType     string                     `json:"peft_type"`
	R            int                        `json:"r"`
	LoraAlpha    float64                    `json:"lora_alpha"`
	UseRSLoRA    bool                       `json:"use_rslora"`
	RankPattern  map[string]json.RawMessage `json:"rank_pattern"`
	AlphaPattern map[string]json.RawMessage `json:"alpha_pattern"`
}

func parseConfig(b []byte) (peftConfig, error) {
	var c peftConfig
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("%w: %s: %v", ErrInvalid, ConfigFile, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return c, fmt.Errorf("%w: %s: data after the JSON object", ErrInvalid, ConfigFile)
	}
	if c.PeftType != "LORA" || c.R <= 0 || !(c.LoraAlpha > 0) || math.IsInf(c.LoraAlpha, 0) {
		return c, fmt.Errorf("%w: %s: peft_type %q, r %d, lora_alpha %g: want a LORA config with positive r and alpha",
			ErrInvalid, ConfigFile, c.PeftType, c.R, c.LoraAlpha)
	}
	return c, nil
}

// sameScale reports whether two configs give their tensors the same meaning.
func (c peftConfig) sameScale(o peftConfig) bool {
	if c.R != o.R || c.LoraAlpha != o.LoraAlpha || c.UseRSLoRA != o.UseRSLoRA {
		return false
	}
	// Marshal compacts raw messages and sorts keys; null and {} (what older
	// and newer exports write for "no pattern") mean the same.
	a, _ := json.Marshal([2]any{orEmpty(c.RankPattern), orEmpty(c.AlphaPattern)})
	b, _ := json.Marshal([2]any{orEmpty(o.RankPattern), orEmpty(o.AlphaPattern)})
	return bytes.Equal(a, b)
}

func orEmpty(m map[string]json.RawMessage) map[string]json.RawMessage {
	if m == nil {
		return map[string]json.RawMessage{}
	}
	return m
}

// Validate checks b: a LoRA config, tensors sorted by unique non-empty
// names, shapes that match the data, finite values, and lora_A [r, in] and
// lora_B [out, r] shapes that agree with the config's rank r (unless the
// config has a rank_pattern).
func (b *Bundle) Validate() error {
	c, err := parseConfig(b.Config)
	if err != nil {
		return err
	}
	if err := checkTensors(b.Tensors, true); err != nil {
		return err
	}
	if len(c.RankPattern) > 0 {
		return nil
	}
	for _, t := range b.Tensors {
		var dim int
		switch {
		case strings.HasSuffix(t.Name, ".lora_A.weight"):
			dim = 0
		case strings.HasSuffix(t.Name, ".lora_B.weight"):
			dim = 1
		default:
			continue
		}
		if len(t.Shape) != 2 || t.Shape[dim] != c.R {
			return fmt.Errorf("%w: %s has shape %v, not rank %d", ErrInvalid, t.Name, t.Shape, c.R)
		}
	}
	return nil
}

// Read reads the PEFT adapter directory dir within the default Limits.
func Read(dir string) (*Bundle, error) { return ReadLimited(dir, Limits{}) }

// ReadLimited reads the PEFT adapter directory dir: F32, BF16 and F16
// tensors are converted to float32; anything else, and anything Validate
// refuses, is an error, as are files over the limits l (zero: defaults).
func ReadLimited(dir string, l Limits) (*Bundle, error) {
	l, err := l.withDefaults()
	if err != nil {
		return nil, err
	}
	cb, err := readFile(filepath.Join(dir, ConfigFile), int64(l.MaxConfigBytes))
	if err != nil {
		return nil, err
	}
	wb, err := readFile(filepath.Join(dir, WeightsFile), l.maxWeightsBytes())
	if err != nil {
		return nil, err
	}
	b, err := parseBundle(cb, wb, l)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return b, nil
}

// parseBundle is ReadLimited after the files are read (l with defaults).
func parseBundle(config, weights []byte, l Limits) (*Bundle, error) {
	ts, _, err := decodeTensors(weights, l)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", WeightsFile, err)
	}
	b := &Bundle{Config: config, Tensors: ts}
	if err := b.Validate(); err != nil {
		return nil, err
	}
	return b, nil
}

// readFile reads the regular file at path if it holds at most max bytes.
func readFile(path string, max int64) ([]byte, error) {
	f, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// Read one byte past the bound to notice a file that grew after Stat.
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%w: %s is over %d bytes", ErrTooLarge, path, max)
	}
	return b, nil
}

func openRegular(path string) (*os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	st, err := f.Stat()
	if err == nil && !st.Mode().IsRegular() {
		err = fmt.Errorf("%s is not a regular file", path)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return f, nil
}

// encodeWeights is the adapter_model.safetensors that Write writes: F32
// tensors in name order, metadata {"format":"pt"}.
func (b *Bundle) encodeWeights() ([]byte, error) {
	if err := b.Validate(); err != nil {
		return nil, err
	}
	return encodeTensors(b.Tensors, map[string]string{"format": "pt"})
}

// Write writes b to the directory dir as its config bytes unchanged and
// F32 safetensors, so that a reader sees the whole bundle or none of it:
// both files go into a new directory beside dir, are synced, and the
// directory is renamed to dir. An existing dir is replaced: it is renamed
// aside first, so for a moment dir is absent, never partial. A crash can
// leave a hidden ".<name>.*.tmp" or ".<name>.*.tmp.old" directory beside
// dir.
func (b *Bundle) Write(dir string) error {
	wb, err := b.encodeWeights()
	if err != nil {
		return err
	}
	dir = filepath.Clean(dir)
	parent, name := filepath.Dir(dir), filepath.Base(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(parent, "."+name+".*.tmp")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp) // after the rename, there is nothing there
	// atomicfile syncs each file and the directory holding it.
	if err := atomicfile.Write(filepath.Join(tmp, ConfigFile), b.Config, 0o644); err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(tmp, WeightsFile), wb, 0o644); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	if st, err := os.Lstat(dir); err == nil && st.IsDir() {
		aside := tmp + ".old"
		if err := os.Rename(dir, aside); err != nil {
			return err
		}
		if err := os.Rename(tmp, dir); err != nil {
			if rerr := os.Rename(aside, dir); rerr != nil {
				return errors.Join(err, rerr)
			}
			return err
		}
		atomicfile.SyncDir(parent)
		// The new bundle is in place: a failure to remove the old one
		// leaves a hidden directory, as a crash would, not a failed Write.
		os.RemoveAll(aside)
		return nil
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return err
	}
	atomicfile.SyncDir(parent)
	return nil
}

// Hash is the hex SHA-256 of the bundle Write writes: see Hash (the
// function) for the definition. A bundle read from a directory that Write
// wrote has the directory's hash; one read from elsewhere (BF16 tensors,
// another tensor order) need not.
func (b *Bundle) Hash() (string, error) {
	wb, err := b.encodeWeights()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	hashPart(h, ConfigFile, int64(len(b.Config)))
	h.Write(b.Config)
	hashPart(h, WeightsFile, int64(len(wb)))
	h.Write(wb)
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Hash returns the hash of the adapter directory dir as it is on disk: the
// lowercase hex SHA-256 of
//
//	"adapter_config.json\n" <decimal byte length> "\n" <the file's bytes>
//	"adapter_model.safetensors\n" <decimal byte length> "\n" <the file's bytes>
//
// so the same two files always give the same hash, and no two different
// pairs of files give the same input. Other files in dir are not covered.
// Hash does not parse the files; Read does.
func Hash(dir string) (string, error) {
	h := sha256.New()
	for _, name := range []string{ConfigFile, WeightsFile} {
		if err := hashFile(h, dir, name); err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func hashPart(h hash.Hash, name string, n int64) {
	io.WriteString(h, name+"\n"+strconv.FormatInt(n, 10)+"\n")
}

func hashFile(h hash.Hash, dir, name string) error {
	f, err := openRegular(filepath.Join(dir, name))
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	n := st.Size()
	hashPart(h, name, n)
	if _, err := io.CopyN(h, f, n); err != nil {
		return fmt.Errorf("%w: %s changed while hashing: %v", ErrInvalid, name, err)
	}
	if k, _ := f.Read(make([]byte, 1)); k != 0 {
		return fmt.Errorf("%w: %s changed while hashing", ErrInvalid, name)
	}
	return nil
}
