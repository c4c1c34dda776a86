package reward

// A minimal WebAssembly binary assembler for tests: wazero has no text
// format parser, so the hand-written modules below (the ABI's smallest
// plugin, and hostile ones) are assembled from instructions.

import (
	"encoding/binary"
	"fmt"
	"math"
)

const (
	tI32 = 0x7f
	tI64 = 0x7e
)

// Instructions used below.
const (
	opUnreachable = 0x00
	opBlock       = 0x02
	opLoop        = 0x03
	opIf          = 0x04
	opElse        = 0x05
	opEnd         = 0x0b
	opBr          = 0x0c
	opBrIf        = 0x0d
	opCall        = 0x10
	opDrop        = 0x1a
	opLocalGet    = 0x20
	opI32Load     = 0x28
	opI32Store    = 0x36
	opMemSize     = 0x3f
	opMemGrow     = 0x40
	opI32Const    = 0x41
	opI64Const    = 0x42
	opI32Ne       = 0x47
	opI32LeU      = 0x4d
	opI32Add      = 0x6a
	blockEmpty    = 0x40
)

type wimport struct {
	mod, name       string
	params, results []byte
}

type wfunc struct {
	export          string // "" for none
	params, results []byte
	body            []byte // instructions, without the final end
}

type wmodule struct {
	imports   []wimport
	funcs     []wfunc
	memPages  uint32 // 0: no memory
	memExport string
	data      map[uint32][]byte
}

func uleb(v uint64) []byte { return binary.AppendUvarint(nil, v) }

func sleb(v int64) []byte {
	var out []byte
	for {
		b := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && b&0x40 == 0) || (v == -1 && b&0x40 != 0) {
			return append(out, b)
		}
		out = append(out, b|0x80)
	}
}

func name(s string) []byte { return append(uleb(uint64(len(s))), s...) }

func vec(items ...[]byte) []byte {
	out := uleb(uint64(len(items)))
	for _, it := range items {
		out = append(out, it...)
	}
	return out
}

func section(id byte, content []byte) []byte {
	return append(append([]byte{id}, uleb(uint64(len(content)))...), content...)
}

func functype(params, results []byte) []byte {
	return append(append(append([]byte{0x60}, uleb(uint64(len(params)))...), params...), append(uleb(uint64(len(results))), results...)...)
}

func i32c(v int32) []byte { return append([]byte{opI32Const}, sleb(int64(v))...) }
func i64c(v int64) []byte { return append([]byte{opI64Const}, sleb(v)...) }

func cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func (m wmodule) bytes() []byte {
	out := []byte{0, 'a', 's', 'm', 1, 0, 0, 0}
	var types, imports, funcs, exports, code, data [][]byte
	for _, im := range m.imports {
		imports = append(imports, cat(name(im.mod), name(im.name), []byte{0x00}, uleb(uint64(len(types)))))
		types = append(types, functype(im.params, im.results))
	}
	for i, f := range m.funcs {
		funcs = append(funcs, uleb(uint64(len(types))))
		types = append(types, functype(f.params, f.results))
		if f.export != "" {
			exports = append(exports, cat(name(f.export), []byte{0x00}, uleb(uint64(len(m.imports)+i))))
		}
		body := cat([]byte{0x00}, f.body, []byte{opEnd}) // no locals
		code = append(code, append(uleb(uint64(len(body))), body...))
	}
	if m.memExport != "" {
		exports = append(exports, cat(name(m.memExport), []byte{0x02, 0x00}))
	}
	for off, b := range m.data {
		data = append(data, cat([]byte{0x00}, i32c(int32(off)), []byte{opEnd}, uleb(uint64(len(b))), b))
	}
	out = append(out, section(1, vec(types...))...)
	if len(imports) > 0 {
		out = append(out, section(2, vec(imports...))...)
	}
	out = append(out, section(3, vec(funcs...))...)
	if m.memPages > 0 {
		out = append(out, section(5, vec(cat([]byte{0x00}, uleb(uint64(m.memPages)))))...)
	}
	out = append(out, section(7, vec(exports...))...)
	out = append(out, section(10, vec(code...))...)
	if len(data) > 0 {
		out = append(out, section(11, vec(data...))...)
	}
	return out
}

// Where the hand-written plugins keep their result and their input.
const (
	resultAt = 64
	inputAt  = 1024
)

// retResult returns ptr<<32|len of a result placed at resultAt.
func retResult(json string) []byte { return i64c(int64(resultAt)<<32 | int64(len(json))) }

// abiPlugin is the ABI's smallest plugin (the WAT in wasm-rewards/ABI.md):
// alloc always answers inputAt, and score returns a constant result after
// running body (which must leave nothing on the stack).
func abiPlugin(result string, body []byte) wmodule {
	return wmodule{
		memPages:  1,
		memExport: "memory",
		data:      map[uint32][]byte{resultAt: []byte(result)},
		funcs: []wfunc{
			{export: "clawmesh_abi", results: []byte{tI32}, body: i32c(1)},
			{export: "clawmesh_alloc", params: []byte{tI32}, results: []byte{tI32}, body: i32c(inputAt)},
			{export: "clawmesh_score", params: []byte{tI32, tI32}, results: []byte{tI64}, body: cat(body, retResult(result))},
		},
	}
}

// Hand-written plugins.
var (
	wasmConst       = abiPlugin(`{"score":0.5,"labels":["const"]}`, nil).bytes()
	wasmJunk        = abiPlugin(`this is not json`, nil).bytes()
	wasmOutOfRange  = abiPlugin(`{"score":3}`, nil).bytes()
	wasmUnreachable = abiPlugin(`{}`, []byte{opUnreachable}).bytes()
	wasmLoop        = abiPlugin(`{}`, []byte{opLoop, blockEmpty, opBr, 0, opEnd}).bytes()
)

// wasmWithScore is a plugin whose score function's body is body.
func wasmWithScore(body []byte) []byte {
	m := abiPlugin(`{"score":1}`, nil)
	m.funcs[2].body = body
	return m.bytes()
}

// wasmGrow grows its memory a page at a time until the host refuses, then
// scores 1 if it ended at most limitPages big, -1 otherwise.
func wasmGrow(limitPages int32) []byte {
	ok, bad := `{"score":1}`, `{"score":-1}`
	m := abiPlugin(ok, nil)
	m.data[resultAt+32] = []byte(bad)
	m.funcs[2].body = cat(
		[]byte{opLoop, blockEmpty}, i32c(1), []byte{opMemGrow, 0}, i32c(-1), []byte{opI32Ne, opBrIf, 0, opEnd},
		[]byte{opMemSize, 0}, i32c(limitPages), []byte{opI32LeU, opIf, tI64},
		retResult(ok), []byte{opElse}, i64c(int64(resultAt+32)<<32|int64(len(bad))), []byte{opEnd},
	)
	return m.bytes()
}

// wasmImporting imports mod.name () -> () and calls it before scoring.
func wasmImporting(mod, fn string) []byte {
	m := abiPlugin(`{"score":1}`, nil)
	m.imports = []wimport{{mod: mod, name: fn}}
	m.funcs[2].body = cat([]byte{opCall, 0}, retResult(`{"score":1}`))
	return m.bytes()
}

// wasmCommand is a WASI command: it exports _start, not _initialize.
func wasmCommand() []byte {
	m := abiPlugin(`{"score":1}`, nil)
	m.funcs = append(m.funcs, wfunc{export: "_start"})
	return m.bytes()
}

// wasmSlowStartFailing is a plugin that is slow to start and fails every
// call: its _initialize counts to iterations (in memory at offset 0, since
// the assembler gives functions no locals), and its clawmesh_score writes
// "call" to the log through clawmesh.log, then traps.
func wasmSlowStartFailing(iterations int32) []byte {
	m := abiPlugin(`{"score":1}`, nil)
	m.imports = []wimport{{mod: "clawmesh", name: "log", params: []byte{tI32, tI32}}}
	m.data[resultAt+32] = []byte("call")
	m.funcs[2].body = cat(i32c(resultAt+32), i32c(4), []byte{opCall, 0, opUnreachable})
	load := []byte{opI32Load, 2, 0}
	m.funcs = append(m.funcs, wfunc{export: "_initialize", body: cat(
		[]byte{opLoop, blockEmpty},
		i32c(0), i32c(0), load, i32c(1), []byte{opI32Add, opI32Store, 2, 0},
		i32c(0), load, i32c(iterations), []byte{opI32Ne, opBrIf, 0, opEnd},
	)})
	return m.bytes()
}

// wasmMissing lacks the export named missing.
func wasmMissing(missing string) []byte {
	m := abiPlugin(`{"score":1}`, nil)
	if missing == "memory" {
		m.memExport = ""
	}
	for i := range m.funcs {
		if m.funcs[i].export == missing {
			m.funcs[i].export = ""
		}
	}
	return m.bytes()
}

// wasmABI declares ABI version v.
func wasmABI(v int32) []byte {
	m := abiPlugin(`{"score":1}`, nil)
	m.funcs[0].body = i32c(v)
	return m.bytes()
}

// wasmFlat is a plugin answering abi with its result bytes.
func wasmFlat(result []byte, abi int32) []byte {
	m := abiPlugin(string(result), nil)
	m.funcs[0].body = i32c(abi)
	return m.bytes()
}

// flatResultBytes writes a result in the flat layout by hand (ABI.md,
// version 2): the 40-byte header, then the label records, then the strings.
func flatResultBytes(score float64, hint string, labels ...string) []byte {
	b := make([]byte, 40+8*len(labels))
	binary.LittleEndian.PutUint32(b[0:], 2)
	binary.LittleEndian.PutUint32(b[4:], 1)
	binary.LittleEndian.PutUint64(b[8:], math.Float64bits(score))
	str := func(at int, s string) {
		binary.LittleEndian.PutUint32(b[at:], uint32(len(b)))
		binary.LittleEndian.PutUint32(b[at+4:], uint32(len(s)))
		b = append(b, s...)
	}
	str(16, hint)
	binary.LittleEndian.PutUint32(b[32:], 40)
	binary.LittleEndian.PutUint32(b[36:], uint32(len(labels)))
	for i, l := range labels {
		str(40+8*i, l)
	}
	return b
}

var _ = fmt.Sprint
