//go:build wasip1

package rewards

import (
	"unsafe"
)

var (
	// input is the buffer the host writes each input into, reused from call
	// to call: a plugin then makes little garbage, and the Go runtime's
	// collector seldom runs.
	input []byte
	// pinned keeps the buffers handed out during a call (judge replies)
	// alive until it returns.
	pinned [][]byte
	inCall bool
	// result holds the last result; its buffer is reused by the next call.
	result []byte
	// decoded and scratch are reused by every call's decoding.
	decoded Input
	scratch flatScratch
)

// maxKept is the largest input or result buffer kept for reuse.
const maxKept = 1 << 20

//go:wasmexport clawmesh_abi
func clawmeshABI() int32 { return ABIVersion }

//go:wasmexport clawmesh_alloc
func clawmeshAlloc(size int32) int32 {
	if size < 0 {
		return 0
	}
	n := int(size) + 1 // +1: a valid pointer even for size 0
	if !inCall {
		if cap(input) < n {
			input = make([]byte, n)
		}
		return int32(uintptr(unsafe.Pointer(&input[0])))
	}
	b := make([]byte, n)
	pinned = append(pinned, b)
	return int32(uintptr(unsafe.Pointer(&b[0])))
}

//go:wasmexport clawmesh_score
func clawmeshScore(ptr, size int32) int64 {
	// The input was allocated by clawmeshAlloc and nothing writes it again
	// during the call, so the decoded strings share its bytes.
	in := unsafe.Slice((*byte)(unsafe.Pointer(uintptr(ptr))), size)
	if cap(result) > maxKept {
		result = nil
	}
	inCall = true
	result = handleFlat(result[:0], in, &decoded, &scratch)
	inCall = false
	pinned = nil
	if cap(input) > maxKept {
		input = nil
	}
	return int64(uintptr(unsafe.Pointer(&result[0])))<<32 | int64(len(result))
}

//go:wasmimport clawmesh log
func hostLog(ptr, size int32)

//go:wasmimport clawmesh judge
func hostJudge(ptr, size int32) int64

// Log writes msg to the node's log, attributed to this plugin.
func Log(msg string) {
	if msg == "" {
		return
	}
	b := []byte(msg)
	hostLog(int32(uintptr(unsafe.Pointer(&b[0]))), int32(len(b)))
}

// Judge asks the node's LLM and returns its reply. Only plugins the node
// configures with judge permission may import it; calling it makes the
// plugin's module import clawmesh.judge.
func Judge(prompt string) (string, error) {
	b := []byte(prompt + "\x00")[:len(prompt)]
	var p int32
	if len(b) > 0 {
		p = int32(uintptr(unsafe.Pointer(&b[0])))
	}
	r := hostJudge(p, int32(len(b)))
	if r == 0 {
		return "", ErrJudge
	}
	ptr, n := uint32(r>>32), uint32(r)
	reply := unsafe.Slice((*byte)(unsafe.Pointer(uintptr(ptr))), n)
	return string(reply), nil
}
