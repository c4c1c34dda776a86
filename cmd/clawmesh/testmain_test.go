package main

import (
	"fmt"
	"os"
	"testing"
)

// testPluginCache is the reward plugins' compilation cache the tests' nodes
// share (node.Config.PluginCache), so that the built-ins compile once per
// test binary, not once per node; tests of the first compilation use a
// node's own.
var testPluginCache string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "clawmesh-test-wazero-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testPluginCache = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
