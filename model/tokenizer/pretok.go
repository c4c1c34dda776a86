package tokenizer

import (
	"fmt"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// QwenPattern is the pre-tokenizer split pattern of Qwen2 and Qwen3 (and of
// cl100k-style tokenizers without the 1–3 digit groups).
const QwenPattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// gpt2Pattern is the pattern ByteLevel uses when its use_regex is true.
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// splitter cuts normalized text into pieces; BPE never merges across pieces.
// yield receives consecutive, non-overlapping substrings of s that together
// cover s.
type splitter interface {
	split(s string, yield func(piece string))
}

// qwenScanner is a hand-written scanner equivalent to QwenPattern with
// Split(behavior: Isolated) semantics. The pattern needs look-ahead, which
// Go's regexp lacks, and regexp2 (a backtracking engine) is several times
// slower than this single forward pass. Equivalence with regexp2 is checked
// by tests and by FuzzScannerMatchesRegexp2. Character classes follow
// regexp2 and Oniguruma (the engine Hugging Face tokenizers uses): \s is
// unicode.IsSpace, \p{L} unicode.IsLetter, \p{N} unicode.IsNumber. An
// invalid UTF-8 byte is classified as U+FFFD and kept verbatim.
type qwenScanner struct{}

func isCRLF(r rune) bool { return r == '\r' || r == '\n' }

func (qwenScanner) split(s string, yield func(string)) {
	for i := 0; i < len(s); {
		n := qwenMatch(s, i)
		yield(s[i : i+n])
		i += n
	}
}

// qwenMatch returns the length in bytes of the pattern's match at s[i:]
// (always > 0 for i < len(s): every character is covered by an alternative).
func qwenMatch(s string, i int) int {
	r, sz := utf8.DecodeRuneInString(s[i:])
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if r == '\'' && i+1 < len(s) {
		c1 := lowerASCII(s[i+1])
		switch c1 {
		case 's', 't', 'm', 'd':
			return 2
		case 'r', 'v', 'l':
			if i+2 < len(s) {
				c2 := lowerASCII(s[i+2])
				if (c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l') {
					return 3
				}
			}
		}
	}
	isL := unicode.IsLetter(r)
	isN := !isL && unicode.IsNumber(r)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if isL {
		return sz + letters(s, i+sz)
	}
	if !isN && !isCRLF(r) {
		if n := letters(s, i+sz); n > 0 {
			return sz + n
		}
	}
	// \p{N}
	if isN {
		return sz
	}
	sp := unicode.IsSpace(r)
	//  ?[^\s\p{L}\p{N}]+[\r\n]*
	j := i
	if r == ' ' {
		j = i + 1
	}
	if k := others(s, j); k > 0 {
		j += k
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j - i
	}
	if !sp {
		// Unreachable: a rune that is neither letter, number nor space is
		// matched by the alternative above.
		return sz
	}
	// Whitespace run [i, end); last is the start of its last rune, lastNL
	// the end of its last CR or LF (-1 if none).
	end, last, lastNL := i, i, -1
	for end < len(s) {
		r, n := utf8.DecodeRuneInString(s[end:])
		if !unicode.IsSpace(r) {
			break
		}
		last = end
		end += n
		if isCRLF(r) {
			lastNL = end
		}
	}
	// \s*[\r\n]+
	if lastNL > 0 {
		return lastNL - i
	}
	// \s+(?!\S)
	if end == len(s) {
		return end - i
	}
	if last > i {
		return last - i
	}
	// \s+
	return end - i
}

func lowerASCII(b byte) byte {
	if 'A' <= b && b <= 'Z' {
		return b + 'a' - 'A'
	}
	return b
}

// letters returns the byte length of the run of \p{L} at s[i:].
func letters(s string, i int) int {
	j := i
	for j < len(s) {
		if c := s[j]; c < utf8.RuneSelf {
			if ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') {
				j++
				continue
			}
			break
		}
		r, n := utf8.DecodeRuneInString(s[j:])
		if !unicode.IsLetter(r) {
			break
		}
		j += n
	}
	return j - i
}

// others returns the byte length of the run of [^\s\p{L}\p{N}] at s[i:].
func others(s string, i int) int {
	j := i
	for j < len(s) {
		r, n := utf8.DecodeRuneInString(s[j:])
		if unicode.IsSpace(r) || unicode.IsLetter(r) || unicode.IsNumber(r) {
			break
		}
		j += n
	}
	return j - i
}

// regexSplitter applies any regexp2 pattern with Split(behavior: Isolated,
// invert: false) semantics: matches and the gaps between them are pieces.
// It serves tokenizer.json files whose pattern is not QwenPattern.
type regexSplitter struct {
	re *regexp2.Regexp
}

func newRegexSplitter(pattern string) (*regexSplitter, error) {
	re, err := regexp2.Compile(pattern, regexp2.Unicode)
	if err != nil {
		return nil, fmt.Errorf("%w: split pattern: %v", ErrUnsupported, err)
	}
	return &regexSplitter{re: re}, nil
}

func (rs *regexSplitter) split(s string, yield func(string)) {
	runes := []rune(s)
	// Byte offset of every rune index; exact for valid UTF-8, and for invalid
	// UTF-8 each bad byte is one U+FFFD rune, so offsets still line up.
	offs := make([]int, 0, len(runes)+1)
	for i := range s {
		offs = append(offs, i)
	}
	offs = append(offs, len(s))
	prev := 0
	m, err := rs.re.FindRunesMatch(runes)
	for err == nil && m != nil {
		a, b := m.Index, m.Index+m.Length
		if a > prev {
			yield(s[offs[prev]:offs[a]])
		}
		if b > a {
			yield(s[offs[a]:offs[b]])
		}
		prev = b
		m, err = rs.re.FindNextMatch(m)
	}
	if prev < len(runes) {
		yield(s[offs[prev]:])
	}
}
