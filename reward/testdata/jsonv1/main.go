// Command jsonv1 is a reward plugin written against ABI version 1 (JSON)
// directly, without the wasm-rewards kit: it exports clawmesh_alloc and
// clawmesh_score but no clawmesh_abi, so the runner sends it the JSON input
// that wasm-rewards/ABI.md documents. It decodes that input with
// encoding/json and answers from what it read, so a test can tell that the
// input crossed the ABI and parsed:
//
//   - score -1 if the content of a next_state message contains "wrong",
//     +0.5 otherwise;
//   - hint "last=<role of the last context message> n=<number of context
//     messages>";
//   - labels echoing meta.plugin, meta.turn, meta.config["echo"], the
//     action's first tool call's name and the feedback count.
//
// Build: GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o jsonv1.wasm
package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"unsafe"
)

// main is not called: the host calls the exports.
func main() {}

type toolCall struct {
	ID        string `json:"id"`
	Type      string `json:"type"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type message struct {
	Role       string            `json:"role"`
	Content    string            `json:"content"`
	Parts      []json.RawMessage `json:"parts"`
	Reasoning  string            `json:"reasoning"`
	Name       string            `json:"name"`
	ToolCalls  []toolCall        `json:"tool_calls"`
	ToolCallID string            `json:"tool_call_id"`
	IsError    bool              `json:"is_error"`
}

type input struct {
	Context   []message `json:"context"`
	Action    message   `json:"action"`
	NextState []message `json:"next_state"`
	Feedback  []struct {
		Score *float64 `json:"score"`
		Text  string   `json:"text"`
	} `json:"feedback"`
	Meta struct {
		Turn      string            `json:"turn"`
		API       string            `json:"api"`
		ToolNames []string          `json:"tool_names"`
		LatencyMS int64             `json:"latency_ms"`
		Model     string            `json:"model"`
		Plugin    string            `json:"plugin"`
		Config    map[string]string `json:"config"`
	} `json:"meta"`
}

type result struct {
	Score  *float64 `json:"score"`
	Hint   string   `json:"hint,omitempty"`
	Labels []string `json:"labels,omitempty"`
	Reason string   `json:"reason,omitempty"`
}

var (
	inBuf  []byte // where the host writes the input
	outBuf []byte // the last result, valid until the next call
)

//go:wasmexport clawmesh_alloc
func clawmeshAlloc(size int32) int32 {
	if size < 0 {
		return 0
	}
	inBuf = make([]byte, int(size)+1) // +1: a valid pointer for size 0
	return int32(uintptr(unsafe.Pointer(&inBuf[0])))
}

//go:wasmexport clawmesh_score
func clawmeshScore(ptr, size int32) int64 {
	b := unsafe.Slice((*byte)(unsafe.Pointer(uintptr(ptr))), size)
	out, err := json.Marshal(score(b))
	if err != nil {
		out = []byte(`{"score":null,"reason":"encode result"}`)
	}
	outBuf = out
	return int64(uintptr(unsafe.Pointer(&outBuf[0])))<<32 | int64(len(outBuf))
}

func score(b []byte) result {
	var in input
	if err := json.Unmarshal(b, &in); err != nil {
		return result{Reason: "decode input: " + err.Error()}
	}
	v := 0.5
	for _, m := range in.NextState {
		if strings.Contains(m.Content, "wrong") {
			v = -1
		}
	}
	last := "none"
	if n := len(in.Context); n > 0 {
		last = in.Context[n-1].Role
	}
	tool := ""
	if len(in.Action.ToolCalls) > 0 {
		tool = in.Action.ToolCalls[0].Name
	}
	return result{
		Score: &v,
		Hint:  fmt.Sprintf("last=%s n=%d", last, len(in.Context)),
		Labels: []string{
			"plugin=" + in.Meta.Plugin,
			"turn=" + in.Meta.Turn,
			"echo=" + in.Meta.Config["echo"],
			"tool=" + tool,
			fmt.Sprintf("feedback=%d", len(in.Feedback)),
		},
		Reason: "next_state null: " + fmt.Sprint(in.NextState == nil),
	}
}
