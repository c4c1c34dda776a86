// Package meter instruments a WebAssembly module so that the code it runs
// pays for itself: a fuel counter, decremented on entry to every function
// and at the head of every loop by the number of instructions that may run
// before the next such point, and by the size of every bulk memory or table
// operation. When the counter goes negative the module calls an imported
// host function, module ImportModule, name ImportName, type () -> i64, which
// either returns new fuel or stops the call (by trapping or panicking).
//
// Every instruction a call executes is paid for before it runs: going back
// needs a loop, and a loop's head pays for its whole body; a call pays for
// the callee's whole body at its entry. So a module cannot run for more
// than about one refill's worth of instructions without the host being
// asked. The host decides there whether the call's time is up; this is
// how the reward runner enforces its deadline, at a fraction of the cost
// of a check at every loop iteration.
//
// The module must be valid WebAssembly 2.0 (the features wazero's
// CoreFeaturesV2 enables). Instrument decodes every instruction and refuses
// what it does not know; what it writes is checked again by the compiler.
// Adding the import shifts the index of every function the module defines
// by one: calls, references, exports, the start function, element
// segments and the name section are renumbered. DWARF sections, which
// point into the old code, are dropped.
package meter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// The import Instrument adds.
const (
	ImportModule = "clawmesh_meter"
	ImportName   = "refuel"
)

// Cost of the dynamic operations, in instructions: bulk memory operations
// pay one per 16 bytes, table operations one per element, memory.grow one
// per 16 bytes of the pages it adds.
const (
	bytesPerUnit   = 4 // log2(16)
	growPageShift  = 16 - bytesPerUnit
	maxSectionSize = 1 << 30
)

// ErrInvalid wraps every reason Instrument refuses a module.
var ErrInvalid = errors.New("meter: cannot instrument module")

func errorf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Section ids.
const (
	secCustom    = 0
	secType      = 1
	secImport    = 2
	secFunction  = 3
	secTable     = 4
	secMemory    = 5
	secGlobal    = 6
	secExport    = 7
	secStart     = 8
	secElement   = 9
	secCode      = 10
	secData      = 11
	secDataCount = 12
)

// order is where a section goes among the others (datacount comes before
// code).
func order(id byte) int {
	switch id {
	case secDataCount:
		return 10
	case secCode:
		return 11
	case secData:
		return 12
	}
	return int(id)
}

type section struct {
	id   byte
	body []byte
}

// module is what Instrument learns of the module before rewriting it.
type module struct {
	sections []section
	// params is the number of parameters of each type; -1 for a type that
	// is not a function type.
	params         []int
	importedFuncs  uint32
	importedGlobs  uint32
	definedFuncs   []uint32 // type index of each defined function
	definedGlobs   uint32
	numTypes       uint32
	refuelType     uint32 // the type index of () -> i64
	refuelFunc     uint32 // the function index of the import
	fuelGlobal     uint32 // the index of the fuel counter
	totalFuncsOrig uint32
	totalGlobsOrig uint32
}

// Instrument returns bin with fuel metering added.
func Instrument(bin []byte) ([]byte, error) {
	if len(bin) < 8 || string(bin[:4]) != "\x00asm" {
		return nil, errorf("not a WebAssembly module")
	}
	if binary.LittleEndian.Uint32(bin[4:8]) != 1 {
		return nil, errorf("unsupported binary version %d", binary.LittleEndian.Uint32(bin[4:8]))
	}
	m := &module{}
	r := &reader{b: bin, off: 8}
	last := 0
	for r.more() {
		id := r.byte()
		size := r.u32()
		if r.err != nil {
			break
		}
		if size > maxSectionSize || int(size) > len(r.b)-r.off {
			return nil, errorf("section %d of %d bytes runs past the end", id, size)
		}
		body := r.b[r.off : r.off+int(size)]
		r.off += int(size)
		if id > secDataCount {
			return nil, errorf("unknown section %d", id)
		}
		if id != secCustom {
			if order(id) <= last {
				return nil, errorf("section %d out of order", id)
			}
			last = order(id)
		}
		m.sections = append(m.sections, section{id, body})
	}
	if r.err != nil {
		return nil, r.err
	}
	if err := m.scan(); err != nil {
		return nil, err
	}
	return m.write()
}

// scan reads what the rewrite needs: types, imports, functions, globals.
func (m *module) scan() error {
	for _, s := range m.sections {
		r := &reader{b: s.body}
		switch s.id {
		case secType:
			n := r.count()
			for i := uint32(0); i < n && r.err == nil; i++ {
				if form := r.byte(); form != 0x60 {
					return errorf("type %d: form 0x%x is not a function type", i, form)
				}
				np := r.count()
				r.skip(int(np))
				nr := r.count()
				r.skip(int(nr))
				m.params = append(m.params, int(np))
			}
			m.numTypes = n
		case secImport:
			n := r.count()
			for i := uint32(0); i < n && r.err == nil; i++ {
				mod, _ := r.name(), r.name()
				if mod == ImportModule {
					return errorf("the module imports from %q, which is reserved", ImportModule)
				}
				switch kind := r.byte(); kind {
				case 0x00:
					r.u32()
					m.importedFuncs++
				case 0x01:
					r.byte()
					r.limits()
				case 0x02:
					r.limits()
				case 0x03:
					r.byte()
					r.byte()
					m.importedGlobs++
				default:
					return errorf("import %d: unknown kind 0x%x", i, kind)
				}
			}
		case secFunction:
			n := r.count()
			for i := uint32(0); i < n && r.err == nil; i++ {
				m.definedFuncs = append(m.definedFuncs, r.u32())
			}
		case secGlobal:
			m.definedGlobs = r.count()
			r.off = len(r.b) // read again when rewritten
		case secTable:
			n := r.count()
			for i := uint32(0); i < n && r.err == nil; i++ {
				r.byte()
				r.limits()
			}
		case secMemory:
			n := r.count()
			for i := uint32(0); i < n && r.err == nil; i++ {
				r.limits()
			}
		case secData:
			n := r.count()
			for i := uint32(0); i < n && r.err == nil; i++ {
				flags := r.u32()
				switch flags {
				case 0, 2:
					if flags == 2 {
						r.memidx()
					}
					if _, err := m.constExpr(r, nil); err != nil {
						return err
					}
				case 1:
				default:
					return errorf("data segment %d: flags %d", i, flags)
				}
				r.skip(int(r.count()))
			}
		case secDataCount:
			r.u32()
		default: // custom, export, start, element, code: read when rewritten
			r.off = len(r.b)
		}
		if r.err != nil {
			return fmt.Errorf("%w (section %d)", r.err, s.id)
		}
		if r.more() {
			return errorf("section %d: %d bytes left over", s.id, len(r.b)-r.off)
		}
	}
	for i, t := range m.definedFuncs {
		if t >= uint32(len(m.params)) {
			return errorf("function %d has type %d of %d", i, t, len(m.params))
		}
	}
	m.totalFuncsOrig = m.importedFuncs + uint32(len(m.definedFuncs))
	m.totalGlobsOrig = m.importedGlobs + m.definedGlobs
	m.refuelType = m.numTypes
	m.refuelFunc = m.importedFuncs
	m.fuelGlobal = m.totalGlobsOrig
	return nil
}

// fn renumbers a function index of the original module.
func (m *module) fn(i uint32) (uint32, error) {
	if i >= m.totalFuncsOrig {
		return 0, errorf("function index %d out of range (%d functions)", i, m.totalFuncsOrig)
	}
	if i >= m.importedFuncs {
		i++
	}
	return i, nil
}

func (m *module) write() ([]byte, error) {
	// Make sure the type, import and global sections exist.
	for _, id := range []byte{secType, secImport, secGlobal} {
		found := false
		for _, s := range m.sections {
			found = found || s.id == id
		}
		if found {
			continue
		}
		at := len(m.sections)
		for i, s := range m.sections {
			if s.id != secCustom && order(s.id) > order(id) {
				at = i
				break
			}
		}
		empty := section{id: id, body: []byte{0}}
		m.sections = append(m.sections[:at], append([]section{empty}, m.sections[at:]...)...)
	}
	out := append([]byte(nil), "\x00asm\x01\x00\x00\x00"...)
	for _, s := range m.sections {
		body, keep, err := m.rewrite(s)
		if err != nil {
			return nil, err
		}
		if !keep {
			continue
		}
		out = append(out, s.id)
		out = binary.AppendUvarint(out, uint64(len(body)))
		out = append(out, body...)
	}
	return out, nil
}

// rewrite returns a section's new body, or keep false to drop it.
func (m *module) rewrite(s section) (body []byte, keep bool, err error) {
	r := &reader{b: s.body}
	var w []byte
	switch s.id {
	case secCustom:
		name := r.name()
		if r.err != nil {
			return nil, false, nil // a custom section with a broken name: drop it
		}
		switch {
		case strings.HasPrefix(name, ".debug_") || name == "sourceMappingURL" || name == "external_debug_info":
			return nil, false, nil
		case name == "name":
			nb, ok := m.renameFuncs(r.b[r.off:])
			if !ok {
				return nil, false, nil
			}
			w = appendName(nil, "name")
			return append(w, nb...), true, nil
		}
		return s.body, true, nil
	case secType:
		n := r.count()
		w = binary.AppendUvarint(w, uint64(n)+1)
		w = append(w, r.b[r.off:]...)
		w = append(w, 0x60, 0x00, 0x01, 0x7e) // () -> i64
		return w, true, r.err
	case secImport:
		n := r.count()
		w = binary.AppendUvarint(w, uint64(n)+1)
		w = append(w, r.b[r.off:]...)
		w = appendName(w, ImportModule)
		w = appendName(w, ImportName)
		w = append(w, 0x00)
		w = binary.AppendUvarint(w, uint64(m.refuelType))
		return w, true, r.err
	case secGlobal:
		n := r.count()
		w = binary.AppendUvarint(w, uint64(n)+1)
		for i := uint32(0); i < n && r.err == nil; i++ {
			w = append(w, r.byte(), r.byte()) // valtype, mutability
			w, err = m.constExpr(r, w)
			if err != nil {
				return nil, false, err
			}
		}
		w = append(w, 0x7e, 0x01, 0x42, 0x00, 0x0b) // mut i64 = 0
		return w, true, r.err
	case secExport:
		n := r.count()
		w = binary.AppendUvarint(w, uint64(n))
		for i := uint32(0); i < n && r.err == nil; i++ {
			w = appendName(w, r.name())
			kind := r.byte()
			idx := r.u32()
			if kind == 0x00 {
				if idx, err = m.fn(idx); err != nil {
					return nil, false, err
				}
			}
			w = append(w, kind)
			w = binary.AppendUvarint(w, uint64(idx))
		}
	case secStart:
		idx, err := m.fn(r.u32())
		if err != nil {
			return nil, false, err
		}
		w = binary.AppendUvarint(w, uint64(idx))
	case secElement:
		if w, err = m.elements(r); err != nil {
			return nil, false, err
		}
	case secCode:
		if w, err = m.code(r); err != nil {
			return nil, false, err
		}
	default:
		return s.body, true, nil
	}
	if r.err == nil && r.more() {
		return nil, false, errorf("section %d: %d bytes left over", s.id, len(r.b)-r.off)
	}
	return w, true, r.err
}

// elements rewrites the element section: every function index in it.
func (m *module) elements(r *reader) ([]byte, error) {
	n := r.count()
	w := binary.AppendUvarint(nil, uint64(n))
	var err error
	for i := uint32(0); i < n && r.err == nil; i++ {
		flags := r.u32()
		if flags > 7 {
			return nil, errorf("element segment %d: flags %d", i, flags)
		}
		w = binary.AppendUvarint(w, uint64(flags))
		if flags&2 != 0 && flags&1 == 0 { // an explicit table index
			w = binary.AppendUvarint(w, uint64(r.u32()))
		}
		if flags&1 == 0 { // active: an offset
			if w, err = m.constExpr(r, w); err != nil {
				return nil, err
			}
		}
		if flags&3 != 0 { // an elemkind or a reftype
			w = append(w, r.byte())
		}
		k := r.count()
		w = binary.AppendUvarint(w, uint64(k))
		for j := uint32(0); j < k && r.err == nil; j++ {
			if flags&4 != 0 {
				if w, err = m.constExpr(r, w); err != nil {
					return nil, err
				}
				continue
			}
			idx, err := m.fn(r.u32())
			if err != nil {
				return nil, err
			}
			w = binary.AppendUvarint(w, uint64(idx))
		}
	}
	return w, r.err
}

// constExpr copies a constant expression, renumbering ref.func.
func (m *module) constExpr(r *reader, w []byte) ([]byte, error) {
	for i := 0; r.err == nil; i++ {
		if i > 1<<16 {
			return nil, errorf("constant expression too long")
		}
		start := r.off
		switch op := r.byte(); op {
		case 0x0b:
			return append(w, op), nil
		case 0x41:
			r.s32()
		case 0x42:
			r.s64()
		case 0x43:
			r.skip(4)
		case 0x44:
			r.skip(8)
		case 0x23:
			if g := r.u32(); g >= m.importedGlobs+m.definedGlobs {
				return nil, errorf("global index %d out of range", g)
			}
		case 0xd0:
			r.byte()
		case 0xd2:
			idx, err := m.fn(r.u32())
			if err != nil {
				return nil, err
			}
			w = append(w, op)
			w = binary.AppendUvarint(w, uint64(idx))
			continue
		case 0x6a, 0x6b, 0x6c, 0x7c, 0x7d, 0x7e: // extended constant expressions
		case 0xfd:
			if sub := r.u32(); sub != 12 {
				return nil, errorf("instruction 0xfd %d in a constant expression", sub)
			}
			r.skip(16)
		default:
			return nil, errorf("instruction 0x%x in a constant expression", op)
		}
		w = append(w, r.b[start:r.off]...)
	}
	return nil, r.err
}

// renameFuncs renumbers the function indices of a name section's function
// names (1), local names (2) and label names (3); other subsections are
// copied. ok is false if the section does not parse.
func (m *module) renameFuncs(b []byte) ([]byte, bool) {
	r := &reader{b: b}
	var w []byte
	for r.more() && r.err == nil {
		id := r.byte()
		size := r.u32()
		if r.err != nil || int(size) > len(r.b)-r.off {
			return nil, false
		}
		sub := &reader{b: r.b[r.off : r.off+int(size)]}
		r.off += int(size)
		if id < 1 || id > 3 {
			w = append(w, id)
			w = binary.AppendUvarint(w, uint64(size))
			w = append(w, sub.b...)
			continue
		}
		var nb []byte
		n := sub.count()
		nb = binary.AppendUvarint(nb, uint64(n))
		for i := uint32(0); i < n && sub.err == nil; i++ {
			idx, err := m.fn(sub.u32())
			if err != nil {
				return nil, false
			}
			nb = binary.AppendUvarint(nb, uint64(idx))
			if id == 1 {
				nb = appendName(nb, sub.name())
				continue
			}
			k := sub.count()
			nb = binary.AppendUvarint(nb, uint64(k))
			for j := uint32(0); j < k && sub.err == nil; j++ {
				nb = binary.AppendUvarint(nb, uint64(sub.u32()))
				nb = appendName(nb, sub.name())
			}
		}
		if sub.err != nil || sub.more() {
			return nil, false
		}
		w = append(w, id)
		w = binary.AppendUvarint(w, uint64(len(nb)))
		w = append(w, nb...)
	}
	return w, r.err == nil
}

func appendName(w []byte, s string) []byte {
	w = binary.AppendUvarint(w, uint64(len(s)))
	return append(w, s...)
}
