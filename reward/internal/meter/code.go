package meter

import (
	"encoding/binary"
)

// Instructions the rewrite looks at or writes.
const (
	opBlock       = 0x02
	opLoop        = 0x03
	opIf          = 0x04
	opElse        = 0x05
	opEnd         = 0x0b
	opCall        = 0x10
	opReturnCall  = 0x12
	opLocalGet    = 0x20
	opLocalTee    = 0x22
	opGlobalGet   = 0x23
	opGlobalSet   = 0x24
	opMemoryGrow  = 0x40
	opI64Const    = 0x42
	opI64LtS      = 0x53
	opI64Sub      = 0x7d
	opI64Shl      = 0x86
	opI64ShrU     = 0x88
	opI64ExtendU  = 0xad
	opRefFunc     = 0xd2
	opPrefixMisc  = 0xfc
	opPrefixSIMD  = 0xfd
	blockTypeNone = 0x40
)

// What an instruction asks of the rewrite.
type kind uint8

const (
	kPlain   kind = iota
	kOpen         // block, if: a nesting level
	kLoop         // loop: a nesting level that pays for its body
	kEnd          // end
	kFunc         // call, return_call, ref.func: a function index to renumber
	kDynamic      // pays for its size operand, which is on top of the stack
)

// instr is one decoded instruction.
type instr struct {
	start, end int // its bytes in the body
	kind       kind
	fn         uint32 // kFunc: the function index
	immAt      int    // kFunc: where the index starts
	shift      int8   // kDynamic: cost = size << shift (negative: >>)
	cost       int64  // kLoop: the instructions of its body
}

// code rewrites the code section.
func (m *module) code(r *reader) ([]byte, error) {
	n := r.count()
	if r.err == nil && int(n) != len(m.definedFuncs) {
		return nil, errorf("%d function bodies for %d functions", n, len(m.definedFuncs))
	}
	w := binary.AppendUvarint(nil, uint64(n))
	var ins []instr
	var body []byte
	for i := uint32(0); i < n && r.err == nil; i++ {
		size := r.u32()
		if r.err != nil || int(size) > len(r.b)-r.off {
			return nil, errorf("function body %d runs past the end", i)
		}
		fb := &reader{b: r.b[r.off : r.off+int(size)]}
		r.off += int(size)
		var err error
		body, ins, err = m.body(fb, m.params[m.definedFuncs[i]], body[:0], ins[:0])
		if err != nil {
			return nil, errorf("function %d: %s", m.importedFuncs+i, trimInvalid(err))
		}
		w = binary.AppendUvarint(w, uint64(len(body)))
		w = append(w, body...)
	}
	return w, r.err
}

func trimInvalid(err error) string {
	s := err.Error()
	prefix := ErrInvalid.Error() + ": "
	if len(s) > len(prefix) && s[:len(prefix)] == prefix {
		return s[len(prefix):]
	}
	return s
}

// body rewrites one function body: one more i32 local (for the size of
// dynamic operations), the entry's payment, a payment at every loop head and
// before every dynamic operation, and renumbered function indices.
func (m *module) body(r *reader, params int, w []byte, ins []instr) ([]byte, []instr, error) {
	// Locals.
	groups := r.count()
	var locals uint64
	localsAt := r.off
	for i := uint32(0); i < groups && r.err == nil; i++ {
		locals += uint64(r.u32())
		r.byte()
	}
	if r.err != nil {
		return w, ins, r.err
	}
	if locals+uint64(params) >= 1<<31 {
		return w, ins, errorf("too many locals")
	}
	tmp := uint32(uint64(params) + locals)
	w = binary.AppendUvarint(w, uint64(groups)+1)
	w = append(w, r.b[localsAt:r.off]...)
	w = append(w, 0x01, 0x7f) // one i32

	// Decode, and find what each loop pays.
	ins, err := m.decode(r, ins)
	if err != nil {
		return w, ins, err
	}

	// Rewrite.
	w = m.pay(w, int64(len(ins)))
	for _, in := range ins {
		code := r.b[in.start:in.end]
		switch in.kind {
		case kLoop:
			w = append(w, code...)
			w = m.pay(w, in.cost)
		case kFunc:
			idx, err := m.fn(in.fn)
			if err != nil {
				return w, ins, err
			}
			w = append(w, r.b[in.start:in.immAt]...)
			w = binary.AppendUvarint(w, uint64(idx))
		case kDynamic:
			w = m.payDynamic(w, tmp, in.shift)
			w = append(w, code...)
		default:
			w = append(w, code...)
		}
	}
	return w, ins, nil
}

// pay writes: fuel -= cost; if fuel < 0 { fuel = refuel() }.
func (m *module) pay(w []byte, cost int64) []byte {
	w = append(w, opGlobalGet)
	w = binary.AppendUvarint(w, uint64(m.fuelGlobal))
	w = append(w, opI64Const)
	w = appendSleb(w, cost)
	w = append(w, opI64Sub, opGlobalSet)
	w = binary.AppendUvarint(w, uint64(m.fuelGlobal))
	return m.check(w)
}

// payDynamic writes, with the size operand on top of the stack (and left
// there): fuel -= size << shift; if fuel < 0 { fuel = refuel() }.
func (m *module) payDynamic(w []byte, tmp uint32, shift int8) []byte {
	w = append(w, opLocalTee)
	w = binary.AppendUvarint(w, uint64(tmp))
	w = append(w, opGlobalGet)
	w = binary.AppendUvarint(w, uint64(m.fuelGlobal))
	w = append(w, opLocalGet)
	w = binary.AppendUvarint(w, uint64(tmp))
	w = append(w, opI64ExtendU)
	switch {
	case shift > 0:
		w = append(w, opI64Const, byte(shift), opI64Shl)
	case shift < 0:
		w = append(w, opI64Const, byte(-shift), opI64ShrU)
	}
	w = append(w, opI64Sub, opGlobalSet)
	w = binary.AppendUvarint(w, uint64(m.fuelGlobal))
	return m.check(w)
}

func (m *module) check(w []byte) []byte {
	w = append(w, opGlobalGet)
	w = binary.AppendUvarint(w, uint64(m.fuelGlobal))
	w = append(w, opI64Const, 0, opI64LtS, opIf, blockTypeNone, opCall)
	w = binary.AppendUvarint(w, uint64(m.refuelFunc))
	w = append(w, opGlobalSet)
	w = binary.AppendUvarint(w, uint64(m.fuelGlobal))
	return append(w, opEnd)
}

func appendSleb(w []byte, v int64) []byte {
	for {
		b := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && b&0x40 == 0) || (v == -1 && b&0x40 != 0) {
			return append(w, b)
		}
		w = append(w, b|0x80)
	}
}

// decode reads a function body's instructions up to its final end, and
// sets each loop's cost: the number of instructions up to its end.
func (m *module) decode(r *reader, ins []instr) ([]instr, error) {
	var open []int // instruction indices of the open blocks; -1 for the body
	open = append(open, -1)
	for len(open) > 0 {
		if r.err != nil {
			return ins, r.err
		}
		if !r.more() {
			return ins, errorf("body ends inside a block")
		}
		in := instr{start: r.off}
		op := r.byte()
		switch {
		case op == 0x00 || op == 0x01 || op == 0x0f || op == 0x1a || op == 0x1b || op == opElse:
			// unreachable, nop, return, drop, select, else
		case op == opBlock || op == opIf:
			r.blockType()
			in.kind = kOpen
		case op == opLoop:
			r.blockType()
			in.kind = kLoop
		case op == opEnd:
			in.kind = kEnd
		case op == 0x0c || op == 0x0d: // br, br_if
			r.u32()
		case op == 0x0e: // br_table
			k := r.count()
			for j := uint32(0); j <= k && r.err == nil; j++ {
				r.u32()
			}
		case op == opCall || op == opReturnCall:
			in.kind, in.immAt = kFunc, r.off
			in.fn = r.u32()
		case op == 0x11 || op == 0x13: // call_indirect, return_call_indirect
			r.u32()
			r.u32()
		case op == 0x1c: // select t*
			k := r.count()
			r.skip(int(k))
		case op >= 0x20 && op <= 0x22: // local.get, set, tee
			r.u32()
		case op == opGlobalGet || op == opGlobalSet:
			if g := r.u32(); g >= m.totalGlobsOrig && r.err == nil {
				return ins, errorf("global index %d out of range (%d globals)", g, m.totalGlobsOrig)
			}
		case op == 0x25 || op == 0x26: // table.get, table.set
			r.u32()
		case op >= 0x28 && op <= 0x3e: // loads and stores
			r.memarg()
		case op == 0x3f: // memory.size
			r.memidx()
		case op == opMemoryGrow:
			r.memidx()
			in.kind, in.shift = kDynamic, growPageShift
		case op == 0x41:
			r.s32()
		case op == opI64Const:
			r.s64()
		case op == 0x43:
			r.skip(4)
		case op == 0x44:
			r.skip(8)
		case op >= 0x45 && op <= 0xc4: // numeric, sign extension
		case op == 0xd0: // ref.null t
			r.byte()
		case op == 0xd1: // ref.is_null
		case op == opRefFunc:
			in.kind, in.immAt = kFunc, r.off
			in.fn = r.u32()
		case op == opPrefixMisc:
			if err := r.misc(&in); err != nil {
				return ins, err
			}
		case op == opPrefixSIMD:
			if err := r.simd(); err != nil {
				return ins, err
			}
		default:
			return ins, errorf("unknown instruction 0x%x at offset %d", op, in.start)
		}
		in.end = r.off
		switch in.kind {
		case kOpen, kLoop:
			open = append(open, len(ins))
		case kEnd:
			if top := open[len(open)-1]; top >= 0 && ins[top].kind == kLoop {
				ins[top].cost = int64(len(ins) - top)
			}
			open = open[:len(open)-1]
		}
		ins = append(ins, in)
	}
	if r.more() {
		return ins, errorf("%d bytes after the body's end", len(r.b)-r.off)
	}
	return ins, r.err
}

// misc reads a 0xfc instruction's immediates.
func (r *reader) misc(in *instr) error {
	switch sub := r.u32(); {
	case sub <= 7: // saturating truncations
	case sub == 8: // memory.init data mem
		r.u32()
		r.memidx()
		in.kind, in.shift = kDynamic, -bytesPerUnit
	case sub == 9: // data.drop
		r.u32()
	case sub == 10: // memory.copy mem mem
		r.memidx()
		r.memidx()
		in.kind, in.shift = kDynamic, -bytesPerUnit
	case sub == 11: // memory.fill mem
		r.memidx()
		in.kind, in.shift = kDynamic, -bytesPerUnit
	case sub == 12: // table.init elem table
		r.u32()
		r.u32()
		in.kind = kDynamic
	case sub == 13: // elem.drop
		r.u32()
	case sub == 14: // table.copy table table
		r.u32()
		r.u32()
		in.kind = kDynamic
	case sub == 15: // table.grow
		r.u32()
		in.kind = kDynamic
	case sub == 16: // table.size
		r.u32()
	case sub == 17: // table.fill
		r.u32()
		in.kind = kDynamic
	default:
		return errorf("unknown instruction 0xfc %d", sub)
	}
	return nil
}

// simd reads a 0xfd instruction's immediates.
func (r *reader) simd() error {
	switch sub := r.u32(); {
	case sub <= 11 || sub == 92 || sub == 93: // loads, store, load_zero
		r.memarg()
	case sub == 12 || sub == 13: // v128.const, i8x16.shuffle
		r.skip(16)
	case sub >= 21 && sub <= 34: // extract_lane, replace_lane
		r.byte()
	case sub >= 84 && sub <= 91: // load_lane, store_lane
		r.memarg()
		r.byte()
	case sub <= 255: // the rest have no immediates
	default:
		return errorf("unknown instruction 0xfd %d", sub)
	}
	return nil
}

// reader decodes the binary format; its first error sticks.
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) more() bool { return r.err == nil && r.off < len(r.b) }

func (r *reader) fail(what string) {
	if r.err == nil {
		r.err = errorf("%s at offset %d", what, r.off)
	}
}

func (r *reader) byte() byte {
	if r.err != nil {
		return 0
	}
	if r.off >= len(r.b) {
		r.fail("unexpected end")
		return 0
	}
	b := r.b[r.off]
	r.off++
	return b
}

func (r *reader) skip(n int) {
	if r.err != nil {
		return
	}
	if n < 0 || n > len(r.b)-r.off {
		r.fail("unexpected end")
		return
	}
	r.off += n
}

// uleb reads an unsigned LEB128 of at most bits bits.
func (r *reader) uleb(bits uint) uint64 {
	var v uint64
	for shift := uint(0); ; shift += 7 {
		if shift >= bits {
			r.fail("integer too long")
			return 0
		}
		b := r.byte()
		if r.err != nil {
			return 0
		}
		v |= uint64(b&0x7f) << shift
		if b&0x80 == 0 {
			if bits < 64 && v>>bits != 0 {
				r.fail("integer too large")
				return 0
			}
			return v
		}
	}
}

// sleb skips a signed LEB128 of at most bits bits.
func (r *reader) sleb(bits uint) {
	for shift := uint(0); ; shift += 7 {
		if shift >= bits {
			r.fail("integer too long")
			return
		}
		b := r.byte()
		if r.err != nil || b&0x80 == 0 {
			return
		}
	}
}

func (r *reader) u32() uint32 { return uint32(r.uleb(32)) }
func (r *reader) s32()        { r.sleb(32) }
func (r *reader) s64()        { r.sleb(64) }

// count reads a vector's length, which cannot exceed the bytes left.
func (r *reader) count() uint32 {
	n := r.u32()
	if r.err == nil && int(n) > len(r.b)-r.off {
		r.fail("vector longer than its section")
		return 0
	}
	return n
}

func (r *reader) name() string {
	n := r.count()
	if r.err != nil {
		return ""
	}
	s := string(r.b[r.off : r.off+int(n)])
	r.off += int(n)
	return s
}

func (r *reader) limits() {
	switch flags := r.byte(); flags {
	case 0x00:
		r.u32()
	case 0x01, 0x03: // max, and shared
		r.u32()
		r.u32()
	default:
		r.fail("unknown limits")
	}
}

func (r *reader) blockType() {
	if r.err != nil || r.off >= len(r.b) {
		r.fail("unexpected end")
		return
	}
	switch b := r.b[r.off]; b {
	case blockTypeNone, 0x7f, 0x7e, 0x7d, 0x7c, 0x7b, 0x70, 0x6f:
		r.off++
	default:
		r.sleb(33) // a type index
	}
}

// memarg reads an alignment and offset; a memory index (multiple memories)
// is refused.
func (r *reader) memarg() {
	if align := r.u32(); align&0x40 != 0 {
		r.fail("multiple memories")
		return
	}
	r.u32()
}

func (r *reader) memidx() {
	if r.byte() != 0 && r.err == nil {
		r.fail("multiple memories")
	}
}
