package reward

import (
	"bytes"
	"errors"
	"fmt"
	"os"
)

// Check reports, without compiling anything, what New and Reload would
// refuse at once: an invalid plugin config (ErrConfig), and with strict an
// enabled plugin whose file cannot be read or is not WebAssembly
// (ErrUnusable, naming it). A set that passes may still fail to load (a
// module without the exports, or one that does not start); a node checks
// this much before it starts serving, and compiles in the background.
func Check(cfgs []PluginConfig, strict bool) error {
	seen := map[string]bool{}
	var unusable []error
	for _, c := range cfgs {
		c, err := normalize(c)
		if err != nil {
			return err
		}
		if seen[c.Name] {
			return fmt.Errorf("%w: plugin name %q used twice", ErrConfig, c.Name)
		}
		seen[c.Name] = true
		if !strict || !c.Enabled || c.Path == "" {
			continue
		}
		b, err := os.ReadFile(c.Path)
		switch {
		case err != nil:
			unusable = append(unusable, fmt.Errorf("%w: %q: read: %v", ErrUnusable, c.Name, err))
		case !bytes.HasPrefix(b, []byte("\x00asm")):
			unusable = append(unusable, fmt.Errorf("%w: %q: compile: %s is not a WebAssembly module", ErrUnusable, c.Name, c.Path))
		}
	}
	return errors.Join(unusable...)
}
