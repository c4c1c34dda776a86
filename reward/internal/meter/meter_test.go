package meter

import (
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// A small assembler for the modules below.

const (
	tI32     = 0x7f
	tI64     = 0x7e
	tFuncref = 0x70
)

func uleb(v uint64) []byte { return binary.AppendUvarint(nil, v) }

func sleb(v int64) []byte { return appendSleb(nil, v) }

func str(s string) []byte { return append(uleb(uint64(len(s))), s...) }

func vec(items ...[]byte) []byte {
	out := uleb(uint64(len(items)))
	for _, it := range items {
		out = append(out, it...)
	}
	return out
}

func cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func sec(id byte, body []byte) []byte { return cat([]byte{id}, uleb(uint64(len(body))), body) }

func functype(params, results []byte) []byte {
	return cat([]byte{0x60}, uleb(uint64(len(params))), params, uleb(uint64(len(results))), results)
}

func i32c(v int32) []byte { return cat([]byte{0x41}, sleb(int64(v))) }

// body is a function body with locals (count, type pairs) and code, end
// appended.
func body(locals [][2]byte, code ...[]byte) []byte {
	var ls [][]byte
	for _, l := range locals {
		ls = append(ls, []byte{l[0], l[1]})
	}
	b := cat(vec(ls...), cat(code...), []byte{opEnd})
	return cat(uleb(uint64(len(b))), b)
}

func header() []byte { return []byte("\x00asm\x01\x00\x00\x00") }

// loopModule: run(n i32) -> i32 counts n down in a loop and returns how
// many iterations it made; spin() loops forever; fill(n i32) fills n bytes
// of memory; rec(d i32) calls itself twice down to depth d (no loop).
func loopModule() []byte {
	types := vec(functype([]byte{tI32}, []byte{tI32}), functype(nil, nil), functype([]byte{tI32}, nil))
	funcs := vec(uleb(0), uleb(1), uleb(2), uleb(2))
	mem := vec([]byte{0x00, 0x20}) // 32 pages (2 MiB)
	exports := vec(
		cat(str("run"), []byte{0x00}, uleb(0)),
		cat(str("spin"), []byte{0x00}, uleb(1)),
		cat(str("fill"), []byte{0x00}, uleb(2)),
		cat(str("rec"), []byte{0x00}, uleb(3)),
		cat(str("memory"), []byte{0x02, 0x00}),
	)
	run := body([][2]byte{{1, tI32}},
		[]byte{opBlock, blockTypeNone, opLoop, blockTypeNone},
		[]byte{0x20, 0x00, 0x45, 0x0d, 0x01},                  // local.get n; i32.eqz; br_if 1
		[]byte{0x20, 0x00}, i32c(1), []byte{0x6b, 0x21, 0x00}, // n = n - 1
		[]byte{0x20, 0x01}, i32c(1), []byte{0x6a, 0x21, 0x01}, // k = k + 1
		[]byte{0x0c, 0x00, opEnd, opEnd}, // br 0
		[]byte{0x20, 0x01},
	)
	spin := body(nil, []byte{opLoop, blockTypeNone, 0x0c, 0x00, opEnd})
	fill := body(nil, i32c(0), i32c(7), []byte{0x20, 0x00, opPrefixMisc, 11, 0x00})
	rec := body(nil,
		[]byte{0x20, 0x00, opIf, blockTypeNone},
		[]byte{0x20, 0x00}, i32c(1), []byte{0x6b, opCall, 0x03},
		[]byte{0x20, 0x00}, i32c(1), []byte{0x6b, opCall, 0x03},
		[]byte{opEnd},
	)
	return cat(header(), sec(secType, types), sec(secFunction, funcs), sec(secMemory, mem),
		sec(secExport, exports), sec(secCode, vec(run, spin, fill, rec)))
}

// meterHost runs instrumented modules with a refuel that grants chunk and
// stops the call after stopAfter refills.
type meterHost struct {
	rt        wazero.Runtime
	chunk     int64
	stopAfter int
	refills   int
}

var errStop = errors.New("out of refills")

func newMeterHost(t testing.TB, chunk int64, stopAfter int) *meterHost {
	ctx := context.Background()
	h := &meterHost{rt: wazero.NewRuntime(ctx), chunk: chunk, stopAfter: stopAfter}
	t.Cleanup(func() { h.rt.Close(ctx) })
	_, err := h.rt.NewHostModuleBuilder(ImportModule).NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, _ api.Module, stack []uint64) {
			h.refills++
			if h.refills > h.stopAfter {
				panic(errStop)
			}
			stack[0] = uint64(h.chunk)
		}), nil, []api.ValueType{api.ValueTypeI64}).Export(ImportName).
		Instantiate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *meterHost) instantiate(t testing.TB, bin []byte) api.Module {
	t.Helper()
	metered, err := Instrument(bin)
	if err != nil {
		t.Fatal(err)
	}
	mod, err := h.rt.Instantiate(context.Background(), metered)
	if err != nil {
		t.Fatal(err)
	}
	return mod
}

func (h *meterHost) call(mod api.Module, fn string, args ...uint64) ([]uint64, error) {
	h.refills = 0
	return mod.ExportedFunction(fn).Call(context.Background(), args...)
}

// TestLoopPays checks that a loop pays for every iteration: the number of
// refills grows with the iterations, and the result is unchanged.
func TestLoopPays(t *testing.T) {
	h := newMeterHost(t, 1000, 1<<30)
	mod := h.instantiate(t, loopModule())
	var prev int
	for _, n := range []uint64{0, 1000, 10_000, 100_000} {
		res, err := h.call(mod, "run", n)
		if err != nil {
			t.Fatalf("run(%d): %v", n, err)
		}
		if res[0] != n {
			t.Errorf("run(%d) = %d", n, res[0])
		}
		t.Logf("run(%d): %d refills of 1000", n, h.refills)
		// An iteration runs 12 instructions; each refill pays for at most
		// 1000 of them.
		if want := int(n) * 12 / 1000; h.refills < want {
			t.Errorf("run(%d): %d refills, want at least %d", n, h.refills, want)
		}
		if n > 0 && h.refills <= prev {
			t.Errorf("run(%d): %d refills, no more than for fewer iterations (%d)", n, h.refills, prev)
		}
		prev = h.refills
	}
}

// TestInfiniteLoopStops checks that the host stops a loop that never ends.
func TestInfiniteLoopStops(t *testing.T) {
	h := newMeterHost(t, 10_000, 50)
	mod := h.instantiate(t, loopModule())
	_, err := h.call(mod, "spin")
	if !errors.Is(err, errStop) {
		t.Fatalf("spin: %v, want %v", err, errStop)
	}
	if h.refills != 51 {
		t.Errorf("%d refills, want 51", h.refills)
	}
}

// TestRecursionPays checks that calls pay at entry: a function that calls
// itself twice, with no loop, is stopped too.
func TestRecursionPays(t *testing.T) {
	h := newMeterHost(t, 10_000, 20)
	mod := h.instantiate(t, loopModule())
	if _, err := h.call(mod, "rec", 5); err != nil {
		t.Fatalf("rec(5): %v", err)
	}
	small := h.refills
	_, err := h.call(mod, "rec", 40) // 2^40 calls
	if !errors.Is(err, errStop) {
		t.Fatalf("rec(40): %v, want %v", err, errStop)
	}
	if small > 1 {
		t.Errorf("rec(5): %d refills of 10,000 for 63 calls", small)
	}
}

// TestBulkMemoryPays checks that memory.fill pays for its size: a large
// fill exhausts a chunk a small one does not.
func TestBulkMemoryPays(t *testing.T) {
	h := newMeterHost(t, 1000, 1<<30)
	mod := h.instantiate(t, loopModule())
	for _, c := range []struct {
		n       uint64
		refills int
	}{{64, 1}, {1 << 20, 2}} {
		// The fuel starts at 0 in a new instance: the entry refills once.
		mod.Close(context.Background())
		mod = h.instantiate(t, loopModule())
		if _, err := h.call(mod, "fill", c.n); err != nil {
			t.Fatal(err)
		}
		if h.refills != c.refills {
			t.Errorf("fill(%d): %d refills, want %d", c.n, h.refills, c.refills)
		}
		if b, _ := mod.Memory().Read(uint32(c.n-1), 1); b[0] != 7 {
			t.Errorf("fill(%d) did not fill", c.n)
		}
	}
}

// renumberModule imports a function, and uses its defined functions in
// every way an index can appear: calls, an export, the start function, an
// element segment and call_indirect, ref.func in a global, and the name
// section.
func renumberModule() []byte {
	types := vec(
		functype([]byte{tI32}, []byte{tI32}), // 0: imported add1, double, triple
		functype(nil, []byte{tI32}),          // 1: run
		functype(nil, nil),                   // 2: start
	)
	imports := vec(cat(str("env"), str("add1"), []byte{0x00}, uleb(0)))
	// Functions: 0 add1 (import), 1 double, 2 triple, 3 run, 4 start.
	funcs := vec(uleb(0), uleb(0), uleb(1), uleb(2))
	table := vec([]byte{tFuncref, 0x00, 0x02})
	globals := vec(
		cat([]byte{tI32, 0x01}, i32c(0), []byte{opEnd}),     // 0: set by start
		cat([]byte{tFuncref, 0x00, opRefFunc, 0x02, opEnd}), // 1: ref.func triple
		cat([]byte{tI32, 0x00}, i32c(100), []byte{opEnd}),   // 2: constant
	)
	exports := vec(
		cat(str("run"), []byte{0x00}, uleb(3)),
		cat(str("double"), []byte{0x00}, uleb(1)),
		cat(str("started"), []byte{0x03}, uleb(0)),
	)
	start := uleb(4)
	elems := vec(
		cat(uleb(0), i32c(0), []byte{opEnd}, vec(uleb(1), uleb(2))), // flags 0: table[0..1] = double, triple
		cat(uleb(3), []byte{0x00}, vec(uleb(2))),                    // flags 3: declarative, for ref.func
	)
	double := body(nil, []byte{0x20, 0x00, 0x20, 0x00, 0x6a})
	triple := body(nil, []byte{0x20, 0x00, 0x20, 0x00, 0x6a, 0x20, 0x00, 0x6a})
	// run: add1(double(1)) + call_indirect table[1](10) + global 3
	//      = 3 + 30 + 100 = 133, with the constant from global 2
	run := body(nil,
		i32c(1), []byte{opCall, 0x01, opCall, 0x00},
		i32c(10), i32c(1), []byte{0x11, 0x00, 0x00},
		[]byte{0x6a, opGlobalGet, 0x02, 0x6a},
	)
	startFn := body(nil, i32c(7), []byte{opGlobalSet, 0x00})
	names := cat(str("name"),
		[]byte{1}, func() []byte {
			b := vec(cat(uleb(0), str("add1")), cat(uleb(1), str("double")), cat(uleb(2), str("triple")), cat(uleb(3), str("run")))
			return cat(uleb(uint64(len(b))), b)
		}(),
	)
	return cat(header(), sec(secType, types), sec(secImport, imports), sec(secFunction, funcs),
		sec(secTable, table), sec(secGlobal, globals), sec(secExport, exports), sec(secStart, start),
		sec(secElement, elems), sec(secCode, vec(double, triple, run, startFn)), sec(secCustom, names))
}

// TestRenumbering runs a module before and after instrumenting it: the
// same results, and the same names.
func TestRenumbering(t *testing.T) {
	ctx := context.Background()
	bin := renumberModule()
	run := func(bin []byte, meter bool) (uint64, uint64, []string) {
		rt := wazero.NewRuntime(ctx)
		defer rt.Close(ctx)
		_, err := rt.NewHostModuleBuilder("env").NewFunctionBuilder().
			WithFunc(func(x uint32) uint32 { return x + 1 }).Export("add1").Instantiate(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if meter {
			_, err := rt.NewHostModuleBuilder(ImportModule).NewFunctionBuilder().
				WithFunc(func() int64 { return 1 << 20 }).Export(ImportName).Instantiate(ctx)
			if err != nil {
				t.Fatal(err)
			}
		}
		code, err := rt.CompileModule(ctx, bin)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, name := range []string{"run", "double"} {
			names = append(names, code.ExportedFunctions()[name].Name())
		}
		mod, err := rt.InstantiateModule(ctx, code, wazero.NewModuleConfig())
		if err != nil {
			t.Fatal(err)
		}
		res, err := mod.ExportedFunction("run").Call(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return res[0], mod.ExportedGlobal("started").Get(), names
	}
	want, wantStarted, wantNames := run(bin, false)
	if want != 133 || wantStarted != 7 {
		t.Fatalf("the module itself: run %d, started %d", want, wantStarted)
	}
	metered, err := Instrument(bin)
	if err != nil {
		t.Fatal(err)
	}
	got, started, names := run(metered, true)
	if got != want || started != wantStarted {
		t.Errorf("instrumented: run %d, started %d; want %d, %d", got, started, want, wantStarted)
	}
	if strings.Join(names, ",") != strings.Join(wantNames, ",") || wantNames[0] != "run" {
		t.Errorf("names %q, want %q", names, wantNames)
	}
}

// TestRefuses checks what Instrument will not take.
func TestRefuses(t *testing.T) {
	code := func(instrs ...byte) []byte {
		return cat(header(), sec(secType, vec(functype(nil, nil))), sec(secFunction, vec(uleb(0))),
			sec(secCode, vec(body(nil, instrs))))
	}
	cases := []struct {
		name, want string
		bin        []byte
	}{
		{"empty", "not a WebAssembly module", nil},
		{"text", "not a WebAssembly module", []byte("(module)")},
		{"version 2", "binary version", []byte("\x00asm\x02\x00\x00\x00")},
		{"truncated section", "runs past the end", cat(header(), []byte{secType, 10, 0})},
		{"unknown section", "unknown section", cat(header(), sec(13, nil))},
		{"out of order", "out of order", cat(header(), sec(secFunction, vec()), sec(secType, vec()))},
		{"reserved import", "reserved", cat(header(), sec(secType, vec(functype(nil, []byte{tI64}))),
			sec(secImport, vec(cat(str(ImportModule), str(ImportName), []byte{0x00}, uleb(0)))))},
		// global.set 0 with no globals: invalid, and after instrumenting
		// it would set the fuel.
		{"the fuel's index", "global index 0 out of range", code(i32c(0)[0], 0, opGlobalSet, 0)},
		{"a call past the end", "function index 1 out of range", code(opCall, 1)},
		{"unknown instruction", "unknown instruction 0x6", code(0x06)},
		{"unknown prefixed", "unknown instruction 0xfc 18", code(opPrefixMisc, 18)},
		{"threads", "unknown instruction 0xfe", code(0xfe, 0x00)},
		{"unclosed block", "ends inside a block", cat(header(), sec(secType, vec(functype(nil, nil))),
			sec(secFunction, vec(uleb(0))), sec(secCode, vec(cat(uleb(3), []byte{0x00, opBlock, blockTypeNone}))))},
		{"bodies and functions", "2 function bodies for 1", cat(header(), sec(secType, vec(functype(nil, nil))),
			sec(secFunction, vec(uleb(0))), sec(secCode, vec(body(nil), body(nil))))},
	}
	for _, c := range cases {
		_, err := Instrument(c.bin)
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
}

// FuzzInstrument feeds Instrument arbitrary bytes: it must not panic, and
// a module it takes that wazero accepts must still be accepted once
// instrumented. (Inputs Instrument refuses are not given to wazero, which
// allocates what a section's count declares before reading it.)
func FuzzInstrument(f *testing.F) {
	f.Add(loopModule())
	f.Add(renumberModule())
	f.Add(header())
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	f.Cleanup(func() { rt.Close(ctx) })
	f.Fuzz(func(t *testing.T, bin []byte) {
		metered, err := Instrument(bin)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("an error that is not ErrInvalid: %v", err)
			}
			return
		}
		code, err := rt.CompileModule(ctx, bin)
		if err != nil {
			return
		}
		code.Close(ctx)
		mc, err := rt.CompileModule(ctx, metered)
		if err != nil {
			t.Fatalf("the instrumented module does not compile: %v", err)
		}
		mc.Close(ctx)
	})
}
