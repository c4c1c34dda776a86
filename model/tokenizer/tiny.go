package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// TinyOptions configures Tiny. The zero value gives the defaults.
type TinyOptions struct {
	// Merges is the number of BPE merges to learn (0 → 320). Fewer may be
	// learnt if the corpus runs out of pairs seen at least twice.
	Merges int
	// Corpus is the training text ("" → a small built-in corpus of chat,
	// tool calls, code and a little Chinese).
	Corpus string
}

// ChatTokens are the added tokens of Tiny, in id order after the learnt
// vocabulary: Qwen3's chat control tokens and its tag tokens. As in Qwen3,
// <|endoftext|>, <|im_start|> and <|im_end|> are special, the tags are not.
var ChatTokens = []AddedToken{
	{Content: "<|endoftext|>", Special: true},
	{Content: "<|im_start|>", Special: true},
	{Content: "<|im_end|>", Special: true},
	{Content: "<tool_call>"},
	{Content: "</tool_call>"},
	{Content: "<tool_response>"},
	{Content: "</tool_response>"},
	{Content: "<think>"},
	{Content: "</think>"},
}

// Tiny learns a small byte-level BPE tokenizer shaped like Qwen3's (NFC,
// QwenPattern split, ByteLevel, the chat tokens of ChatTokens): ids 0–255
// are the bytes, then one id per learnt merge, then the chat tokens. The
// result is deterministic for given options. MarshalJSON writes it as a
// tokenizer.json that Load, Hugging Face tokenizers and transformers.js read.
func Tiny(opts TinyOptions) (*Tokenizer, error) {
	if opts.Merges < 0 {
		return nil, fmt.Errorf("tokenizer: TinyOptions.Merges %d < 0", opts.Merges)
	}
	if opts.Merges == 0 {
		opts.Merges = 320
	}
	if opts.Corpus == "" {
		opts.Corpus = tinyCorpus
	}
	bl := newByteLevel()
	vocab := make(map[string]int, 256+opts.Merges)
	spell := make([]string, 0, 256+opts.Merges)
	for b := range 256 {
		vocab[bl.enc[b]] = b
		spell = append(spell, bl.enc[b])
	}
	// Distinct pieces of the corpus with their counts, as id sequences.
	counts := map[string]int{}
	qwenScanner{}.split(nfcString(opts.Corpus), func(p string) { counts[p]++ })
	type word struct {
		ids []int
		n   int
	}
	words := make([]word, 0, len(counts))
	for p, n := range counts {
		ids := make([]int, len(p))
		for i := 0; i < len(p); i++ {
			ids[i] = int(p[i])
		}
		words = append(words, word{ids, n})
	}
	var merges [][2]string
	for len(merges) < opts.Merges {
		freq := map[[2]int]int{}
		for _, w := range words {
			for i := 0; i+1 < len(w.ids); i++ {
				freq[[2]int{w.ids[i], w.ids[i+1]}] += w.n
			}
		}
		var best [2]int
		bestN := 1
		for p, n := range freq {
			// Most frequent; ties go to the pair with the smaller ids, so
			// the result does not depend on map order.
			if n > bestN || (n == bestN && bestN > 1 && (p[0] < best[0] || (p[0] == best[0] && p[1] < best[1]))) {
				best, bestN = p, n
			}
		}
		if bestN < 2 {
			break
		}
		s := spell[best[0]] + spell[best[1]]
		// The same spelling may be reached by another split; such a pair
		// merges into the existing token.
		if _, dup := vocab[s]; !dup {
			vocab[s] = len(spell)
			spell = append(spell, s)
		}
		id := vocab[s]
		merges = append(merges, [2]string{spell[best[0]], spell[best[1]]})
		for wi := range words {
			ids := words[wi].ids
			out := ids[:0]
			for i := 0; i < len(ids); i++ {
				if i+1 < len(ids) && ids[i] == best[0] && ids[i+1] == best[1] {
					out = append(out, id)
					i++
					continue
				}
				out = append(out, ids[i])
			}
			words[wi].ids = out
		}
	}
	added := make([]AddedToken, len(ChatTokens))
	for i, a := range ChatTokens {
		a.ID = len(spell) + i
		added[i] = a
	}
	t := &Tokenizer{bl: bl, nfc: true}
	if err := t.setPattern(QwenPattern); err != nil {
		return nil, err
	}
	if err := t.build(vocab, merges, added); err != nil {
		return nil, err
	}
	return t, nil
}

// MarshalJSON writes the tokenizer as a Hugging Face tokenizer.json.
func (t *Tokenizer) MarshalJSON() ([]byte, error) {
	type addedJSON struct {
		ID         int    `json:"id"`
		Content    string `json:"content"`
		SingleWord bool   `json:"single_word"`
		LStrip     bool   `json:"lstrip"`
		RStrip     bool   `json:"rstrip"`
		Normalized bool   `json:"normalized"`
		Special    bool   `json:"special"`
	}
	added := make([]addedJSON, len(t.added))
	for i, a := range t.added {
		added[i] = addedJSON{ID: a.ID, Content: a.Content, Special: a.Special}
	}
	byteLevel := map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}
	pre := []any{}
	if t.pattern != "" {
		pre = append(pre, map[string]any{
			"type": "Split", "pattern": map[string]string{"Regex": t.pattern},
			"behavior": "Isolated", "invert": false,
		})
	}
	pre = append(pre, byteLevel)
	var normalizer any
	if t.nfc {
		normalizer = map[string]string{"type": "NFC"}
	}
	vocab := make(map[string]int, len(t.tokens))
	for id, s := range t.tokens {
		if s != "" && !t.addedIDs[id] {
			vocab[s] = id
		}
	}
	merges := t.mergeStr
	if merges == nil {
		merges = [][2]string{}
	}
	return json.Marshal(map[string]any{
		"version":        "1.0",
		"truncation":     nil,
		"padding":        nil,
		"added_tokens":   added,
		"normalizer":     normalizer,
		"pre_tokenizer":  map[string]any{"type": "Sequence", "pretokenizers": pre},
		"post_processor": byteLevel,
		"decoder":        byteLevel,
		"model": map[string]any{
			"type": "BPE", "dropout": nil, "unk_token": nil,
			"continuing_subword_prefix": "", "end_of_word_suffix": "",
			"fuse_unk": false, "byte_fallback": false, "ignore_merges": t.ignoreMerges,
			"vocab": vocab, "merges": merges,
		},
	})
}

// Save writes the tokenizer.json to path.
func (t *Tokenizer) Save(path string) error {
	data, err := t.MarshalJSON()
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("tokenizer: %w", err)
	}
	return nil
}

// tinyCorpus is the built-in training text of Tiny: the kind of text the
// demo's tiny model sees (chat turns, tool calls and results, code).
var tinyCorpus = strings.Repeat(`You are a helpful assistant. The user asks a question and the assistant answers it.
Hello! How can I help you today? I'd like to know the weather in Paris, please.
The weather in Paris is sunny with a temperature of 21 degrees. Is there anything else you'd like to know?
Thanks, that's all. You're welcome! Have a great day.
Please list the files in the current directory and read the README.
{"name": "list_files", "arguments": {"path": "."}}
{"name": "read_file", "arguments": {"path": "README.md"}}
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
{"files": ["README.md", "main.go", "go.mod"], "error": null}
Error: file not found. Let me try again with the correct path.
No, that is not what I meant. I asked for the summary, not the whole file.
Sorry about that. Here is a short summary of the file: it describes the project and how to build it.
func main() {
	fmt.Println("hello, world")
}
def add(a, b):
    return a + b
for i in range(10):
    print(i * i)
The answer is 42. Let me think step by step: first add the numbers, then divide by two.
你好，我能帮你什么？今天天气很好。
`, 3)
