package scrub

import (
	"slices"
	"strings"
)

// groups is a run of digit groups and the separators between them, as
// phone numbers, card numbers, IPv4 addresses and SSNs are written:
// "+1 (415) 555-0132", "4111 1111 1111 1111", "10.0.4.17", "123-45-6789".
type groups struct {
	start, end int
	plus       bool  // starts with '+'
	paren      int   // index of the group written in parentheses, or -1
	lens       []int // digits per group
	seps       []byte
	total      int
}

// scanGroups reads the run of digit groups at s (a digit, '+' or '(').
// Separators are single spaces, '-' or '.', or a closing parenthesis with or
// without a space after it.
func scanGroups(t string, s int) (g groups, ok bool) {
	g.start, g.paren = s, -1
	var lensBuf [8]int
	var sepsBuf [8]byte
	g.lens, g.seps = lensBuf[:0], sepsBuf[:0]
	i := s
	if t[i] == '+' {
		g.plus = true
		i++
	} else if t[i] == '%' {
		g.plus = true // "%2B", a '+' percent-encoded in a URL
		i += 3
	}
	// groupEnd is where the groups read so far end: a group that turns
	// out not to be one ("3ds", "(Tobias)") is dropped with the separator
	// before it.
	groupEnd := -1
	for len(g.lens) < 8 {
		paren := false
		if i < len(t) && t[i] == '(' && g.paren < 0 {
			paren = true
			i++
		}
		j := i
		for j < len(t) && isDigit(t[j]) && j-i < 20 {
			j++
		}
		bad := j == i || j-i >= 20 || paren && (j >= len(t) || t[j] != ')') ||
			!paren && j < len(t) && isWord(t[j])
		if bad {
			if groupEnd < 0 || j-i >= 20 {
				return g, false
			}
			g.seps = g.seps[:len(g.lens)-1]
			i = groupEnd
			break
		}
		if paren {
			g.paren = len(g.lens)
		}
		g.lens = append(g.lens, j-i)
		g.total += j - i
		i = j
		if paren {
			i++ // ')'
			if i < len(t) && isDigit(t[i]) {
				g.seps = append(g.seps, ')')
				continue
			}
		}
		groupEnd = i
		// An area code and a slash: "030/12345678", "089 / 123 456".
		if len(g.lens) == 1 && !g.plus && g.paren < 0 && t[s] == '0' {
			if n := slashSep(t, i); n > 0 {
				g.seps = append(g.seps, '/')
				i += n
				continue
			}
		}
		if i+1 < len(t) && (t[i] == ' ' || t[i] == '-' || t[i] == '.') && (isDigit(t[i+1]) || t[i+1] == '(' && g.paren < 0) {
			if paren && t[i] == '.' {
				break
			}
			g.seps = append(g.seps, t[i])
			i++
			continue
		}
		break
	}
	g.end = i
	if i < len(t) && (isWord(t[i]) || isDigit(t[i])) {
		return g, false
	}
	// A further '.', '-' or ':' then a digit continues the number in a way
	// none of these are written (a longer version string, a date-time).
	if i+1 < len(t) && (t[i] == '.' || t[i] == '-' || t[i] == '/') && isDigit(t[i+1]) {
		return g, false
	}
	return g, true
}

// slashSep returns the length of a slash between digit groups at i ("/" or
// " / "), or 0.
func slashSep(t string, i int) int {
	switch {
	case i+1 < len(t) && t[i] == '/' && isDigit(t[i+1]):
		return 1
	case i+3 < len(t) && t[i] == ' ' && t[i+1] == '/' && t[i+2] == ' ' && isDigit(t[i+3]):
		return 3
	}
	return 0
}

func (g *groups) sepsAll(c byte) bool {
	for _, s := range g.seps {
		if s != c {
			return false
		}
	}
	return true
}

func (g *groups) shape(lens ...int) bool {
	if len(g.lens) != len(lens) {
		return false
	}
	for i, l := range lens {
		if g.lens[i] != l {
			return false
		}
	}
	return true
}

// number tries IPv4, card, SSN and phone at s.
func (d *detector) number(s int) {
	t := d.text
	g, ok := scanGroups(t, s)
	if !ok {
		return
	}
	if !g.plus && g.paren < 0 {
		if len(g.lens) == 4 && g.sepsAll('.') {
			return // an IPv4 address (ipv4), or a version
		}
		if d.card(&g) || d.ssn(&g) {
			return
		}
	}
	d.phone(&g)
}

// ipv4: four decimal octets, not part of a longer dotted run, not loopback,
// unspecified or a netmask, not a version.
func (d *detector) ipv4(s int) {
	t := d.text
	var oct [4]int
	i := s
	for k := 0; k < 4; k++ {
		if k > 0 {
			if i >= len(t) || t[i] != '.' {
				return
			}
			i++
		}
		j := i
		v := 0
		for j < len(t) && isDigit(t[j]) && j-i < 4 {
			v = v*10 + int(t[j]-'0')
			j++
		}
		if j == i || j-i > 3 || v > 255 {
			return
		}
		oct[k] = v
		i = j
	}
	if i < len(t) && (isWord(t[i]) || (t[i] == '.' || t[i] == '-') && i+1 < len(t) && isDigit(t[i+1])) {
		return
	}
	if oct[0] == 127 || oct[0] == 0 || oct[0] == 255 {
		return // loopback, unspecified, netmask: nothing personal
	}
	if versionContext(t, s) || numberingContext(t, s) {
		return
	}
	d.add(s, i, IP, "")
}

// versionContext reports whether the number at s follows a word that says
// it is a version ("version 1.2.3.4", "v 10.0.0.1", "Chrome/120...").
func versionContext(t string, s int) bool {
	if s > 0 && (t[s-1] == '/' || t[s-1] == 'v' || t[s-1] == 'V') {
		if t[s-1] == '/' {
			// "Chrome/120.0.0.1", not "/10.0.0.1" at a path's start
			return s > 1 && isAlpha(t[s-2])
		}
		return true
	}
	pre := strings.ToLower(before(t, s, 16))
	pre = strings.TrimRight(pre, " :=\t\"'")
	w := len(pre)
	for w > 0 && isAlpha(pre[w-1]) {
		w--
	}
	switch pre[w:] {
	case "version", "ver", "release", "build", "firmware", "driver", "v":
		return true
	}
	return false
}

// numberingContext reports whether the number at s follows a word that
// says it numbers a part of a document ("section 4.3.2.1", "§ 4.3.2.1",
// "clause 10.2.3.4").
func numberingContext(t string, s int) bool {
	pre := strings.TrimRight(before(t, s, 16), " \t")
	if strings.HasSuffix(pre, "§") {
		return true
	}
	pre = strings.ToLower(strings.TrimRight(pre, ".:"))
	w := len(pre)
	for w > 0 && isAlpha(pre[w-1]) {
		w--
	}
	switch pre[w:] {
	case "section", "sec", "sect", "chapter", "ch", "clause", "paragraph", "para", "article", "art", "figure", "fig", "table", "appendix", "step", "item", "rule", "part":
		return true
	}
	return false
}

// card: 13 to 19 digits, plain or grouped by spaces or dashes, a known issuer
// prefix and a valid Luhn check digit.
func (d *detector) card(g *groups) bool {
	if g.total < 13 || g.total > 19 {
		return false
	}
	switch {
	case len(g.lens) == 1:
	case !(g.sepsAll(' ') || g.sepsAll('-')):
		return false
	case g.shape(4, 4, 4, 4), g.shape(4, 4, 4, 4, 3), g.shape(4, 6, 5), g.shape(4, 6, 4), g.shape(4, 4, 5), g.shape(4, 4, 4, 1), g.shape(4, 4, 4, 2), g.shape(4, 4, 4, 3), g.shape(4, 4, 4, 4, 1), g.shape(4, 4, 4, 4, 2):
	default:
		return false
	}
	digits := make([]byte, 0, 19)
	for _, c := range []byte(d.text[g.start:g.end]) {
		if isDigit(c) {
			digits = append(digits, c)
		}
	}
	if !issuer(digits) || !luhn(digits) {
		return false
	}
	if len(g.lens) == 1 && idContext(d.text, g.start) {
		return false // request_id=2284070619056365: one in ten ids passes Luhn
	}
	d.add(g.start, g.end, Card, "")
	return true
}

// issuer reports a card number prefix of a major network of the right length.
func issuer(n []byte) bool {
	p2 := int(n[0]-'0')*10 + int(n[1]-'0')
	p4 := p2*100 + int(n[2]-'0')*10 + int(n[3]-'0')
	l := len(n)
	switch {
	case n[0] == '4':
		return l == 13 || l == 16 || l == 19 // Visa
	case p2 >= 51 && p2 <= 55, p4 >= 2221 && p4 <= 2720:
		return l == 16 // Mastercard
	case p2 == 34 || p2 == 37:
		return l == 15 // Amex
	case p4 == 6011 || p2 == 65 || p4 >= 6440 && p4 <= 6499:
		return l >= 16 // Discover
	case p2 == 35:
		return l >= 16 // JCB
	case p2 == 36 || p2 == 38 || p4 >= 3000 && p4 <= 3059:
		return l >= 14 // Diners
	case p2 == 62:
		return l >= 16 // UnionPay
	case p2 == 50 || p2 >= 56 && p2 <= 69:
		return l >= 12 // Maestro
	}
	return false
}

func luhn(n []byte) bool {
	sum := 0
	for i := len(n) - 1; i >= 0; i-- {
		v := int(n[i] - '0')
		if (len(n)-1-i)%2 == 1 {
			v *= 2
			if v > 9 {
				v -= 9
			}
		}
		sum += v
	}
	return sum%10 == 0
}

// ssn: ddd-dd-dddd with a valid area, group and serial; or nine digits
// right after "SSN".
func (d *detector) ssn(g *groups) bool {
	t := d.text
	var digits string
	switch {
	case g.shape(3, 2, 4) && g.sepsAll('-'):
		digits = t[g.start:g.start+3] + t[g.start+4:g.start+6] + t[g.start+7:g.end]
	case g.shape(3, 2, 4) && g.sepsAll(' ') && ssnJustBefore(t, g.start):
		// "SSN 123 45 6789": spaced, as forms print it, only where a word
		// says SSN (three numbers in a row are many things).
		digits = t[g.start:g.start+3] + t[g.start+4:g.start+6] + t[g.start+7:g.end]
	case g.shape(9) && ssnContext(t, g.start):
		digits = t[g.start:g.end]
	default:
		return false
	}
	area, grp, serial := digits[:3], digits[3:5], digits[5:]
	if area == "000" || area == "666" || area[0] == '9' || grp == "00" || serial == "0000" {
		return g.shape(3, 2, 4) && g.sepsAll('-') // shaped like one: no phone either
	}
	d.add(g.start, g.end, SSN, "")
	return true
}

// ssnJustBefore: a word that says SSN before s, and no other number
// between ("SSN 000 12 3456, matrix 512 16 2048" is one SSN-shaped number
// after the word, and it is not the matrix).
func ssnJustBefore(t string, s int) bool {
	pre := strings.ToLower(before(t, s, 32))
	k := max(lastWord(pre, "ssn"), lastWord(pre, "social security"))
	return k >= 0 && !hasDigit(pre[k:])
}

// lastWord returns where w last stands in s as a whole word, or -1:
// "ssn" in `"ssn": `, not in "classname".
func lastWord(s, w string) int {
	for e := len(s); ; {
		i := strings.LastIndex(s[:e], w)
		if i < 0 {
			return -1
		}
		if (i == 0 || !isAlpha(s[i-1])) && (i+len(w) == len(s) || !isAlpha(s[i+len(w)])) {
			return i
		}
		e = i + len(w) - 1
	}
}

func ssnContext(t string, s int) bool {
	pre := strings.ToLower(before(t, s, 32))
	return strings.Contains(pre, "ssn") || strings.Contains(pre, "social security")
}

// phone: international numbers (+CC ..., %2BCC... in a URL, 00CC ...),
// numbers with a parenthesised area code or trunk prefix ("(0)20 ..."), and
// the common national shapes: North American 3-3-4, Chinese mobiles 3-4-4,
// and numbers with a trunk 0 in two to five groups (UK, Germany, France,
// Japan, ...), the area code perhaps set off by a slash (030/1234567).
// Bare digit runs count only after a word that says phone.
func (d *detector) phone(g *groups) {
	t := d.text
	slash := len(g.seps) > 0 && g.seps[0] == '/'
	if slash && g.start > 0 && t[g.start-1] == '/' {
		return // a path: /spool/0800/1234
	}
	if !g.plus && (g.end+1 < len(t) && t[g.end] == '-' && isAlpha(t[g.end+1]) || codeContext(t, g.start)) {
		return // a code: "0301-2345-6789-A", "the lot number is 0301-2345-6789"
	}
	switch {
	case g.plus:
		if g.total < 8 || g.total > 15 {
			return
		}
		if len(g.lens) == 1 {
			if g.total < 10 {
				return
			}
		} else if g.lens[0] > 3 && g.paren != 0 {
			return
		}
		if !g.sepsAll('.') && strings.IndexByte(string(g.seps), '.') >= 0 {
			return
		}
	case g.paren == 0 && g.lens[0] == 1:
		// "(0)20 7946 0958": the trunk prefix that callers from abroad
		// leave out, then the national number.
		if t[g.start+1] != '0' || g.total < 9 || g.total > 12 || len(g.lens) < 3 || !g.restGroups(2) {
			return
		}
	case g.paren == 0:
		if g.lens[0] < 2 || g.lens[0] > 5 || g.total < 10 || g.total > 12 || len(g.lens) < 2 {
			return
		}
	case g.paren > 0:
		return
	case g.total >= 3 && t[g.start] == '0' && t[g.start+1] == '0' && t[g.start+2] != '0':
		// The international prefix: "0049301234567", "0044 20 7946 0958".
		switch {
		case len(g.lens) == 1:
			if g.total < 12 || g.total > 17 || idContext(t, g.start) {
				return
			}
		case g.lens[0] < 3 || g.lens[0] > 5 || g.total < 11 || g.total > 17 || !g.sepsAll(' '):
			return
		}
	case len(g.lens) < 2:
		if g.total < 7 || g.total > 15 || !phoneContext(t, g.start) {
			return
		}
	case g.shape(3, 3, 4) && (g.sepsAll(' ') || g.sepsAll('-') || g.sepsAll('.')):
		if t[g.start] < '2' {
			return
		}
	case g.shape(3, 4, 4) && (g.sepsAll(' ') || g.sepsAll('-')) && t[g.start] == '1' && t[g.start+1] >= '3':
	case len(g.lens) >= 3 && g.lens[0] == 1 && g.lens[1] == 3 && t[g.start] == '0':
		// Service numbers with the trunk 0 set apart: French "0 800 12 34
		// 56", "0 805 123 456"; UK freephone "0 800 123 4567".
		if t[g.start+2] != '8' || g.total < 10 || g.total > 11 || !g.sepsAll(' ') || !g.restGroups(2) {
			return
		}
	case t[g.start] == '0' && t[g.start+1] != '0':
		if g.total < 9 || g.total > 12 || len(g.lens) > 5 || g.lens[0] > 5 || g.lens[0] < 2 {
			return
		}
		seps := g.seps
		if slash {
			seps = seps[1:]
		}
		if !(allByte(seps, ' ') || allByte(seps, '-') || allByte(seps, '.') && len(g.lens) == 5) {
			return
		}
		for _, l := range g.lens {
			if l < 2 {
				return
			}
		}
	default:
		if g.total < 7 || g.total > 15 || !phoneContext(t, g.start) {
			return
		}
	}
	d.add(g.start, g.end, Phone, "")
}

// restGroups reports whether every group after the first has at least n
// digits.
func (g *groups) restGroups(n int) bool {
	for _, l := range g.lens[1:] {
		if l < n {
			return false
		}
	}
	return true
}

func allByte(s []byte, c byte) bool {
	for _, b := range s {
		if b != c {
			return false
		}
	}
	return true
}

func phoneContext(t string, s int) bool {
	pre := strings.ToLower(before(t, s, 24))
	for _, w := range []string{"tel", "phone", "mobile", "cell", "call", "fax", "whatsapp", "sms", "text me", "ring me", "handy", "téléphone"} {
		if hasWord(pre, w) {
			return true
		}
	}
	return false
}

// codeWords say that the number after them is a code of some kind, not a
// phone number.
var codeWords = []string{"lot", "batch", "build", "serial", "part", "sku", "order", "invoice", "ticket", "job", "ref", "reference", "tracking", "model", "isbn", "version", "release"}

// codeContext reports a number that the words just before it (since the
// last punctuation, within 24 bytes) say is a code and not a phone: "the
// lot number is 0301-2345-6789", "build 0301-2345-6789"; not "order
// questions: call 0301 234 5678".
func codeContext(t string, s int) bool {
	pre := strings.ToLower(before(t, s, 24))
	if i := strings.LastIndexAny(pre, ".,;:!?()[]{}\"'=\n"); i >= 0 {
		pre = pre[i+1:]
	}
	for _, w := range []string{"tel", "phone", "mobile", "cell", "call", "fax", "whatsapp", "sms", "text", "ring", "dial", "contact", "reach"} {
		if hasWord(pre, w) {
			return false
		}
	}
	for _, w := range codeWords {
		if hasWord(pre, w) {
			return true
		}
	}
	return false
}

// hasWord reports w in s as a whole word, or its plural ("phones"), not
// as part of a longer one ("telegram", "Atelier").
func hasWord(s, w string) bool {
	for off := 0; ; {
		i := strings.Index(s[off:], w)
		if i < 0 {
			return false
		}
		i += off
		e := i + len(w)
		if e < len(s) && s[e] == 's' {
			e++
		}
		if (i == 0 || !isAlpha(s[i-1])) && (e == len(s) || !isAlpha(s[e])) {
			return true
		}
		off = i + 1
	}
}

// idContext reports a number assigned to an id ("request_id=", "id: ").
func idContext(t string, s int) bool {
	pre := strings.TrimRight(strings.ToLower(before(t, s, 16)), " :=\t\"'")
	return strings.HasSuffix(pre, "id")
}

// telegram: a bot token, "<bot id>:AA<33 characters>".
func (d *detector) telegram(s int) {
	t := d.text
	j := runOf(t, s, isDigit)
	if j-s < 8 || j-s > 10 || !strings.HasPrefix(t[j:], ":AA") {
		return
	}
	e := runOf(t, j+1, isB64URL)
	if e-(j+1) < 35 || e < len(t) && isAlnum(t[e]) {
		return
	}
	d.add(s, e, APIKey, "telegram")
}

// ibanLengths are the IBAN lengths of the countries that use them.
var ibanLengths = map[string]int{
	"AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22, "BR": 29,
	"BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DK": 18, "DO": 28, "EE": 20, "EG": 29,
	"ES": 24, "FI": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28,
	"HR": 21, "HU": 28, "IE": 22, "IL": 23, "IQ": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20,
	"LB": 28, "LC": 32, "LI": 21, "LT": 20, "LU": 20, "LV": 21, "MC": 27, "MD": 24, "ME": 22, "MK": 19,
	"MR": 27, "MT": 31, "MU": 30, "NL": 18, "NO": 15, "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29,
	"RO": 24, "RS": 22, "SA": 24, "SC": 31, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "ST": 25, "SV": 28,
	"TL": 23, "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20,
}

func isUpperDigit(c byte) bool { return isUpper(c) || isDigit(c) }

// iban: a country code, two check digits and the account, compact or in
// groups of four, of the country's length, passing the mod-97 check.
func (d *detector) iban(s int) {
	t := d.text
	if s+4 > len(t) || !isUpper(t[s+1]) || !isDigit(t[s+2]) || !isDigit(t[s+3]) {
		return
	}
	want, ok := ibanLengths[t[s:s+2]]
	if !ok {
		return
	}
	var buf [34]byte
	raw := buf[:0]
	j := s
	grouped := false
	for j < len(t) && len(raw) < want {
		c := t[j]
		if isUpperDigit(c) {
			raw = append(raw, c)
			j++
			continue
		}
		if c == ' ' && len(raw)%4 == 0 && j+1 < len(t) && isUpperDigit(t[j+1]) && (grouped || len(raw) == 4) {
			grouped = true
			j++
			continue
		}
		break
	}
	if len(raw) != want || j < len(t) && isAlnum(t[j]) {
		return
	}
	if !mod97(raw) {
		return
	}
	d.add(s, j, IBAN, "")
}

// mod97 is the ISO 13616 check: the account then the country code and check
// digits, letters as 10..35, is 1 modulo 97.
func mod97(raw []byte) bool {
	r := 0
	add := func(c byte) {
		if isDigit(c) {
			r = (r*10 + int(c-'0')) % 97
		} else {
			v := int(c-'A') + 10
			r = (r*100 + v) % 97
		}
	}
	for _, c := range raw[4:] {
		add(c)
	}
	for _, c := range raw[:4] {
		add(c)
	}
	return r == 1
}

// before returns the n bytes of t before s, a placeholder counting as one
// byte ("#"), so that what a keyword window sees does not depend on how
// long the placeholders in it are.
func before(t string, s, n int) string {
	var buf [64]byte
	out := buf[:0]
	i := s
	for i > 0 && len(out) < n {
		if t[i-1] == '>' {
			if j := strings.LastIndexByte(t[max(0, i-40):i-1], '<'); j >= 0 {
				j += max(0, i-40)
				if placeholderLen(t[j:i]) == i-j {
					out = append(out, '#')
					i = j
					continue
				}
			}
		}
		out = append(out, t[i-1])
		i--
	}
	slices.Reverse(out)
	return string(out)
}

// niNumber: a UK National Insurance number, two prefix letters, six digits
// and a suffix letter A to D, compact ("QQ123456C") or spaced as it is
// printed ("QQ 12 34 56 C"). The prefix is checked against the letters
// never used (D, F, I, U, V; O second; BG, GB, KN, NK, NT, TN, ZZ); Q is
// kept, for HMRC's own example QQ 12 34 56 C is written as if real.
func (d *detector) niNumber(s int) {
	t := d.text
	if s > 0 && isAlnum(t[s-1]) || s+9 > len(t) || !isUpper(t[s+1]) {
		return
	}
	a, b := t[s], t[s+1]
	if strings.IndexByte("DFIUV", a) >= 0 || strings.IndexByte("DFIUVO", b) >= 0 {
		return
	}
	switch t[s : s+2] {
	case "BG", "GB", "KN", "NK", "NT", "TN", "ZZ":
		return
	}
	i := s + 2
	spaced := t[i] == ' '
	for k := 0; k < 3; k++ {
		if spaced {
			if i >= len(t) || t[i] != ' ' {
				return
			}
			i++
		}
		if i+2 > len(t) || !isDigit(t[i]) || !isDigit(t[i+1]) {
			return
		}
		i += 2
	}
	if spaced {
		if i >= len(t) || t[i] != ' ' {
			return
		}
		i++
	}
	if i >= len(t) || t[i] < 'A' || t[i] > 'D' || i+1 < len(t) && isAlnum(t[i+1]) {
		return
	}
	d.add(s, i+1, NINumber, "")
}
