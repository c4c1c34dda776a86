package weights

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
)

// The two files of a PEFT adapter bundle.
const (
	ConfigFile  = "adapter_config.json"
	WeightsFile = "adapter_model.safetensors"
)

// ErrBundle is bytes that are not a packed bundle.
var ErrBundle = errors.New("weights: bad bundle")

// Pack packs the PEFT bundle in dir for the wire: the config's length (4
// bytes, big-endian), the config, then the weights.
func Pack(dir string) ([]byte, error) {
	cfg, err := os.ReadFile(filepath.Join(dir, ConfigFile))
	if err != nil {
		return nil, err
	}
	model, err := os.ReadFile(filepath.Join(dir, WeightsFile))
	if err != nil {
		return nil, err
	}
	out := make([]byte, 4, 4+len(cfg)+len(model))
	binary.BigEndian.PutUint32(out, uint32(len(cfg)))
	out = append(out, cfg...)
	return append(out, model...), nil
}

// Split returns a packed bundle's config and weights.
func Split(b []byte) (cfg, model []byte, err error) {
	if len(b) < 4 {
		return nil, nil, fmt.Errorf("%w: %d bytes", ErrBundle, len(b))
	}
	n := binary.BigEndian.Uint32(b)
	if uint64(n) > uint64(len(b)-4) || n > 1<<20 {
		return nil, nil, fmt.Errorf("%w: config of %d bytes", ErrBundle, n)
	}
	return b[4 : 4+n], b[4+n:], nil
}

// Unpack writes a packed bundle's two files into dir (made if missing),
// each synced, and syncs dir.
func Unpack(b []byte, dir string) error {
	cfg, model, err := Split(b)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for name, data := range map[string][]byte{ConfigFile: cfg, WeightsFile: model} {
		if err := writeSynced(filepath.Join(dir, name), data); err != nil {
			return err
		}
	}
	atomicfile.SyncDir(dir)
	return nil
}

func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
