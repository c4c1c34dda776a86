package reward

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	notWasm := filepath.Join(dir, "x.wasm")
	os.WriteFile(notWasm, []byte("package main\n"), 0o600)
	wasm := filepath.Join(dir, "ok.wasm")
	os.WriteFile(wasm, []byte("\x00asm\x01\x00\x00\x00"), 0o600)
	missing := filepath.Join(dir, "gone.wasm")
	for _, c := range []struct {
		cfgs   []PluginConfig
		strict bool
		err    error
		want   string
	}{
		{Builtins(), true, nil, ""},
		{[]PluginConfig{{Path: wasm, Enabled: true}}, true, nil, ""},
		{[]PluginConfig{{Path: missing, Enabled: true}}, true, ErrUnusable, `"gone": read: open ` + missing + ": no such file"},
		{[]PluginConfig{{Path: missing, Enabled: true}}, false, nil, ""},
		{[]PluginConfig{{Path: missing}}, true, nil, ""},
		{[]PluginConfig{{Path: notWasm, Enabled: true}}, true, ErrUnusable, "not a WebAssembly module"},
		{[]PluginConfig{{Builtin: "nope", Enabled: true}}, true, ErrConfig, `no built-in plugin "nope"`},
		{[]PluginConfig{{Builtin: "feedback"}, {Name: "feedback", Path: wasm}}, true, ErrConfig, "used twice"},
	} {
		err := Check(c.cfgs, c.strict)
		if c.err == nil && err != nil || c.err != nil && (!errors.Is(err, c.err) || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("Check(%+v, %v) = %v, want %v with %q", c.cfgs, c.strict, err, c.err, c.want)
		}
	}
}
