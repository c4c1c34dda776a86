package scrub

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// nameMatcher finds the user's listed names: case-insensitively (ASCII
// letters fold; other letters match as written or as strings.ToLower
// writes them), as whole words, with any run of white space between the
// words of a name.
type nameMatcher struct {
	names [][]string // each name's words, ASCII letters lower-cased
}

func newNameMatcher(list []string) (*nameMatcher, error) {
	if len(list) == 0 {
		return nil, nil
	}
	m := &nameMatcher{}
	seen := map[string]bool{}
	for _, n := range list {
		key := strings.Join(strings.Fields(n), " ")
		if utf8.RuneCountInString(key) < 2 {
			return nil, fmt.Errorf("scrub: name %q is too short to hide (two characters at least)", n)
		}
		if len(key) > 200 {
			return nil, fmt.Errorf("scrub: name %q is too long (200 bytes at most)", n)
		}
		if strings.ContainsAny(key, "<>") {
			return nil, fmt.Errorf("scrub: name %q may not contain < or >", n)
		}
		// Text is folded for ASCII letters only (offsets must not move), so
		// a name with other letters is looked for as written and as
		// lower-cased.
		for _, v := range []string{foldASCII(key), foldASCII(strings.ToLower(key))} {
			if seen[v] {
				continue
			}
			seen[v] = true
			m.names = append(m.names, strings.Fields(v))
		}
	}
	return m, nil
}

// find appends the names in text to found.
func (m *nameMatcher) find(text string, found []Finding) []Finding {
	lower := foldASCII(text)
	for _, words := range m.names {
		w0 := words[0]
		for off := 0; off < len(lower); {
			i := strings.Index(lower[off:], w0)
			if i < 0 {
				break
			}
			s := off + i
			off = s + 1
			if !wordBoundaryBefore(text, s) {
				continue
			}
			e := s + len(w0)
			ok := true
			for _, w := range words[1:] {
				j := e
				for j < len(lower) && (lower[j] == ' ' || lower[j] == '\t' || lower[j] == '\n' || lower[j] == '\r') {
					j++
				}
				if j == e || !strings.HasPrefix(lower[j:], w) {
					ok = false
					break
				}
				e = j + len(w)
			}
			if !ok || !wordBoundaryAfter(text, e) {
				continue
			}
			found = append(found, Finding{Start: s, End: e, Kind: Name})
			off = e
		}
	}
	return found
}

// foldASCII lower-cases ASCII letters only, so byte offsets do not move.
func foldASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if isUpper(s[i]) {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if isUpper(b[j]) {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

// A name is a whole word when the characters around it are not letters or
// digits. Scripts written without spaces (CJK) have no word boundaries: a
// name starting or ending with such a letter matches anywhere.
func wordBoundaryBefore(text string, s int) bool {
	if s == 0 {
		return true
	}
	r, _ := utf8.DecodeLastRuneInString(text[:s])
	first, _ := utf8.DecodeRuneInString(text[s:])
	return !isWordRune(r) || noSpaces(first)
}

func wordBoundaryAfter(text string, e int) bool {
	if e >= len(text) {
		return true
	}
	r, _ := utf8.DecodeRuneInString(text[e:])
	last, _ := utf8.DecodeLastRuneInString(text[:e])
	return !isWordRune(r) || noSpaces(last)
}

func isWordRune(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) }

func noSpaces(r rune) bool {
	return unicode.In(r, unicode.Han, unicode.Hiragana, unicode.Katakana, unicode.Thai, unicode.Lao, unicode.Khmer, unicode.Myanmar)
}
