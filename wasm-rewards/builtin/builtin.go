// Package builtin holds the built-in reward plugins, compiled to WebAssembly
// from the sources in its sub-directories by wasm-rewards/build.sh and
// embedded gzip-compressed. It owns the compiled bytes only; the runner that
// hosts them is package reward.
package builtin

import (
	"bytes"
	"compress/gzip"
	"embed"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
)

//go:embed *.wasm.gz GOVERSION
var files embed.FS

// ErrUnknown is returned for a name that is not a built-in plugin.
var ErrUnknown = errors.New("builtin: unknown plugin")

// Names lists the built-in plugins, sorted.
func Names() []string {
	entries, _ := files.ReadDir(".")
	var out []string
	for _, e := range entries {
		if n, ok := strings.CutSuffix(e.Name(), ".wasm.gz"); ok {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// Has says whether name is a built-in plugin.
func Has(name string) bool {
	_, err := files.Open(name + ".wasm.gz")
	return err == nil && !strings.ContainsAny(name, "/.")
}

// Module returns the WebAssembly module of the built-in plugin name.
func Module(name string) ([]byte, error) {
	if !Has(name) {
		return nil, fmt.Errorf("%w %q", ErrUnknown, name)
	}
	gz, err := files.ReadFile(name + ".wasm.gz")
	if err != nil {
		return nil, err
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, fmt.Errorf("builtin: %s: %w", name, err)
	}
	return io.ReadAll(zr)
}

// GoVersion is the Go release that compiled the embedded modules; only the
// same release rebuilds them byte for byte.
func GoVersion() string {
	b, _ := files.ReadFile("GOVERSION")
	return strings.TrimSpace(string(b))
}
