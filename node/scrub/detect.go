package scrub

import (
	"net/netip"
	"strings"
)

// detector is one scan of one text. The scan is a single pass over the
// bytes: each detector is tried only where its trigger is (an '@' for
// e-mail, "://" for URLs, '=' or ':' for assignments, a word start for
// numbers and vendor prefixes, ...), so that text with nothing to find, the
// bulk of what agents send, costs little more than reading it. Detectors
// add candidates; resolve later settles overlaps.
//
// The detectors are hand-written rather than regular expressions: Go's
// regexp engine scans an alternation of a few dozen patterns at a few MB/s,
// and most of these checks (Luhn, mod-97, octet ranges, the shape of a
// phone number's groups) are not regular anyway.
type detector struct {
	text  string
	found []Finding
}

func (d *detector) add(start, end int, k Kind, detail string) {
	d.found = append(d.found, Finding{Start: start, End: end, Kind: k, Detail: detail})
}

// Byte classes, looked up: the scan asks them of every byte.
const (
	cDigit = 1 << iota
	cUpper
	cLower
	cUnderscore
	cHex
)

var classes = func() (t [256]uint8) {
	for c := '0'; c <= '9'; c++ {
		t[c] = cDigit | cHex
	}
	for c := 'A'; c <= 'Z'; c++ {
		t[c] = cUpper
		t[c+'a'-'A'] = cLower
	}
	for c := 'a'; c <= 'f'; c++ {
		t[c] |= cHex
		t[c-'a'+'A'] |= cHex
	}
	t['_'] = cUnderscore
	return t
}()

func isDigit(c byte) bool { return classes[c]&cDigit != 0 }
func isUpper(c byte) bool { return classes[c]&cUpper != 0 }
func isLower(c byte) bool { return classes[c]&cLower != 0 }
func isAlpha(c byte) bool { return classes[c]&(cUpper|cLower) != 0 }
func isAlnum(c byte) bool { return classes[c]&(cUpper|cLower|cDigit) != 0 }
func isWord(c byte) bool  { return classes[c] != 0 }
func isHex(c byte) bool   { return classes[c]&cHex != 0 }

// isB64URL reports the alphabet of base64url: letters, digits, '-' and '_'.
func isB64URL(c byte) bool { return isAlnum(c) || c == '-' || c == '_' }

// runOf returns the end of the run of bytes from i that satisfy ok.
func runOf(t string, i int, ok func(byte) bool) int {
	for i < len(t) && ok(t[i]) {
		i++
	}
	return i
}

func (d *detector) scan() {
	t := d.text
	n := len(t)
	for i := 0; i < n; i++ {
		c := t[i]
		switch c {
		case '@':
			d.email(i, 1)
		case '%':
			// Percent-encoded in a URL: "jane%40example.com",
			// "phone=%2B4930123456".
			if i+3 < n && t[i+1] == '4' && t[i+2] == '0' {
				d.email(i, 3)
			} else if i+3 < n && t[i+1] == '2' && (t[i+2] == 'B' || t[i+2] == 'b') && isDigit(t[i+3]) && (i == 0 || !isAlnum(t[i-1])) {
				d.number(i)
			}
		case ':':
			if i+2 < n && t[i+1] == '/' && t[i+2] == '/' {
				d.url(i)
			} else if i+1 < n && t[i+1] == ':' && (i == 0 || !isHex(t[i-1]) && t[i-1] != ':') {
				d.ipv6(i)
			}
			d.assign(i)
		case '=', ',':
			d.assign(i)
		case '<':
			if i+1 < n && isAlpha(t[i+1]) {
				d.xmlElement(i)
			}
		case '-':
			if strings.HasPrefix(t[i:], "-----BEGIN ") {
				d.pem(i)
			} else if i+2 < n && t[i+1] == '-' && isAlpha(t[i+2]) && (i == 0 || !isWord(t[i-1]) && t[i-1] != '-') {
				d.flag(i)
			}
		case '/', '\\':
			d.home(i)
		case '+':
			if i+1 < n && isDigit(t[i+1]) && (i == 0 || !isAlnum(t[i-1])) {
				d.number(i)
			}
		case '(':
			if i+1 < n && isDigit(t[i+1]) && (i == 0 || !isAlnum(t[i-1])) {
				d.number(i)
			}
		}
		if isAlnum(c) && (i == 0 || !isWord(t[i-1])) {
			d.word(i)
		}
	}
}

// word tries the detectors that start at a word.
func (d *detector) word(i int) {
	t := d.text
	c := t[i]
	var prev byte
	if i > 0 {
		prev = t[i-1]
	}
	if isDigit(c) {
		// A digit group right after another and a space continues it (the
		// rest of an IBAN, a card, a column of numbers): not a start.
		cont := prev == ' ' && i > 1 && isDigit(t[i-2])
		if prev != '.' && prev != '-' && prev != '+' && !cont {
			d.number(i)
		}
		if prev != '.' && prev != '-' {
			d.ipv4(i)
		}
		d.telegram(i)
	}
	if isHex(c) && prev != ':' && prev != '.' {
		d.ipv6(i)
	}
	if isUpper(c) {
		d.iban(i)
		d.niNumber(i)
	}
	if isAlpha(c) || isDigit(c) {
		d.vendor(i)
	}
	if isAlpha(c) {
		e := runOf(t, i, func(c byte) bool { return isWord(c) || c == '-' })
		if e-i >= 6 && e < len(t) && (t[e] == ' ' || t[e] == '\t') {
			d.spaced(i, e)
		}
	}
}

// ---- e-mail

func isLocal(c byte) bool {
	return isAlnum(c) || c == '.' || c == '_' || c == '%' || c == '+' || c == '-' || c == '\''
}

// unhex is the value of a hex digit.
func unhex(c byte) byte {
	switch {
	case c >= 'a':
		return c - 'a' + 10
	case c >= 'A':
		return c - 'A' + 10
	}
	return c - '0'
}

func isDomainByte(c byte) bool { return isAlnum(c) || c == '.' || c == '-' }

// email looks at an address around the '@' at at, written in n bytes: 1,
// or 3 for "%40" in a URL.
func (d *detector) email(at, n int) {
	t := d.text
	s := at
	for s > 0 && at-s <= 64 && isLocal(t[s-1]) {
		s--
	}
	if at-s > 64 || s > 0 && t[s-1] == '@' {
		return
	}
	if n > 1 {
		// Percent-encoded: an encoded byte that no address holds ("%3D",
		// '=') ends what came before it ("q%3Djane%40example.com").
		for i := at - 3; i >= s; i-- {
			if t[i] == '%' && isHex(t[i+1]) && isHex(t[i+2]) && !isLocal(unhex(t[i+1])<<4|unhex(t[i+2])) {
				s = i + 3
				break
			}
		}
	}
	for s < at && !isAlnum(t[s]) {
		s++ // quotes and dots around the address
	}
	if s == at {
		return
	}
	if s >= 3 && t[s-3:s] == "://" {
		return // a URL's user without a password: not an address
	}
	ds := at + n
	e := ds
	for e < len(t) && e-ds < 256 && isDomainByte(t[e]) {
		e++
	}
	for e > ds && (t[e-1] == '.' || t[e-1] == '-') {
		e--
	}
	if !validDomain(t[ds:e]) {
		return
	}
	if e < len(t) && (isWord(t[e]) || t[e] == '@') {
		return
	}
	if t[s:at] == "git" && e < len(t) && t[e] == ':' {
		return // git@github.com:org/repo.git, an SSH remote
	}
	d.add(s, e, Email, "")
}

// validDomain reports a host name of at least two labels whose last is
// alphabetic (a top-level domain), so version strings and package specs
// (lodash@4.17.21) are not addresses.
func validDomain(dom string) bool {
	labels := strings.Split(dom, ".")
	if len(labels) < 2 {
		return false
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
	}
	tld := labels[len(labels)-1]
	if len(tld) < 2 || len(tld) > 24 {
		return false
	}
	for _, c := range []byte(tld) {
		if !isAlpha(c) {
			return false
		}
	}
	return true
}

// ---- URLs: credentials, webhooks

func isSchemeByte(c byte) bool { return isAlnum(c) || c == '+' || c == '.' || c == '-' }

// isURLStop ends a URL.
func isURLStop(c byte) bool {
	switch c {
	case ' ', '\t', '\n', '\r', '"', '\'', '<', '>', '`', '\\', '|', '{', '}', '^':
		return true
	}
	return c < 0x20
}

func (d *detector) url(i int) {
	t := d.text
	s := i
	for s > 0 && i-s < 32 && isSchemeByte(t[s-1]) {
		s--
	}
	if i-s < 2 || !isAlpha(t[s]) {
		return
	}
	a := i + 3
	ae := a
	for ae < len(t) && !isURLStop(t[ae]) && t[ae] != '/' && t[ae] != '?' && t[ae] != '#' {
		ae++
	}
	auth := t[a:ae]
	host := auth
	if at := strings.LastIndexByte(auth, '@'); at > 0 {
		host = auth[at+1:]
		ui := auth[:at]
		if c := strings.IndexByte(ui, ':'); c >= 0 && c < len(ui)-1 && secretValue(ui[c+1:], classPassword, false) {
			d.add(a, a+at, Credential, "")
		}
	}
	ue := ae
	for ue < len(t) && !isURLStop(t[ue]) {
		ue++
	}
	for ue > ae && strings.IndexByte(".,;:!?)]", t[ue-1]) >= 0 {
		ue--
	}
	path := t[ae:ue]
	if h, _, ok := strings.Cut(host, ":"); ok {
		host = h
	}
	host = strings.ToLower(host)
	switch {
	case host == "hooks.slack.com" && strings.HasPrefix(path, "/services/") && len(path) > 20:
		d.add(s, ue, APIKey, "slack")
	case (host == "discord.com" || host == "discordapp.com" || strings.HasSuffix(host, ".discord.com")) &&
		strings.HasPrefix(path, "/api/webhooks/") && len(path) > 30:
		d.add(s, ue, APIKey, "discord")
	}
}

// ---- PEM private keys

func (d *detector) pem(i int) {
	t := d.text
	ls := i + len("-----BEGIN ")
	le := strings.Index(t[ls:min(len(t), ls+64)], "-----")
	if le < 0 {
		return
	}
	label := t[ls : ls+le]
	if !strings.HasSuffix(label, "PRIVATE KEY") && !strings.HasSuffix(label, "PRIVATE KEY BLOCK") {
		return
	}
	for _, c := range []byte(label) {
		if !isUpper(c) && !isDigit(c) && c != ' ' {
			return // "-----BEGIN [A-Z ]*PRIVATE KEY-----", a pattern
		}
	}
	body := ls + le + 5
	end := "-----END " + label + "-----"
	if e := strings.Index(t[body:min(len(t), body+64<<10)], end); e >= 0 {
		d.add(i, body+e+len(end), PrivateKey, "")
		return
	}
	// Cut short: take the body as far as it goes.
	j := body
	for j < len(t) {
		c := t[j]
		switch {
		case isAlnum(c) || c == '+' || c == '/' || c == '=' || c == '\n' || c == '\r' || c == ' ' || c == ':' || c == '-' || c == ',':
			j++
		case c == '\\' && j+1 < len(t) && (t[j+1] == 'n' || t[j+1] == 'r'):
			j += 2
		default:
			d.add(i, j, PrivateKey, "")
			return
		}
	}
	d.add(i, j, PrivateKey, "")
}

// ---- home directories

var homeUserExempt = map[string]bool{
	"shared": true, "public": true, "default": true, "default user": true, "all users": true, "defaultapppool": true,
}

func (d *detector) home(i int) {
	t := d.text
	var ns int
	win := false
	switch {
	case strings.HasPrefix(t[i:], "/home/"):
		ns = i + 6
	case strings.HasPrefix(t[i:], "/Users/"):
		ns = i + 7
	case strings.HasPrefix(t[i:], `\Users\`):
		// C:\Users\NAME, escaped once or more in JSON: skip the rest of
		// the backslashes.
		ns, win = i+7, true
		for ns < len(t) && t[ns] == '\\' {
			ns++
		}
	default:
		return
	}
	if inWebURL(t, i) {
		return
	}
	ne := ns
	for ne < len(t) && ne-ns < 64 {
		c := t[ne]
		if c == '/' || c == '\\' || isPathStop(c) {
			break
		}
		ne++
	}
	if win && ne < len(t) && t[ne] == ' ' {
		// Windows user names may hold spaces: "C:\Users\Ada Lovelace\".
		j := ne
		for j < len(t) && j-ns < 48 && (isAlnum(t[j]) || t[j] == ' ' || t[j] == '.' || t[j] == '-' || t[j] == '_') {
			j++
		}
		if j < len(t) && t[j] == '\\' {
			ne = j
		}
	}
	name := t[ns:ne]
	if name == "" || name == "." || name == ".." || homeUserExempt[strings.ToLower(name)] {
		return
	}
	switch name[0] {
	case '<', '$', '%', '{', '*', '~', '.', '[', '(':
		return
	}
	d.add(ns, ne, User, "")
}

func isPathStop(c byte) bool {
	switch c {
	case ' ', '\t', '\n', '\r', '"', '\'', '`', '<', '>', '|', ':', ';', ',', ')', ']', '}', '*', '?', '=', '&', '#':
		return true
	}
	return c < 0x20
}

// inWebURL reports whether position i is in the path of a URL other than
// file://, where /home/ and /Users/ are a site's pages, not a disk's.
func inWebURL(t string, i int) bool {
	for j := i - 1; j >= 0 && i-j < 512; j-- {
		c := t[j]
		if isURLStop(c) {
			return false
		}
		if c == ':' && j+2 < len(t) && t[j+1] == '/' && t[j+2] == '/' {
			return !strings.HasSuffix(t[max(0, j-4):j], "file")
		}
	}
	return false
}

// ---- IPv6

func (d *detector) ipv6(s int) {
	t := d.text
	j := s
	colons := 0
	for j < len(t) && j-s < 48 && (isHex(t[j]) || t[j] == ':' || t[j] == '.') {
		if t[j] == ':' {
			colons++
		}
		j++
	}
	if colons < 2 {
		return
	}
	for j > s && (t[j-1] == '.' || t[j-1] == ':' && (j-2 < s || t[j-2] != ':')) {
		j--
	}
	if j < len(t) && (isAlnum(t[j]) || t[j] == '_') {
		return
	}
	addr := t[s:j]
	end := j
	if j < len(t) && t[j] == '%' {
		end = runOf(t, j+1, func(c byte) bool { return isAlnum(c) || c == '_' || c == '.' || c == '-' })
		if end == j+1 {
			end = j
		}
	}
	groups := 0
	for _, g := range strings.Split(addr, ":") {
		if g != "" {
			groups++
		}
	}
	if groups < 2 || !hasDigit(addr) {
		return // "::bad", "dead::beef": words
	}
	a, err := netip.ParseAddr(addr)
	if err != nil || !a.Is6() || a.IsLoopback() || a.IsUnspecified() {
		return
	}
	d.add(s, end, IP, "")
}

// parseIP returns the canonical form of an IP address (with or without an
// IPv6 zone).
func parseIP(s string) (string, bool) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return "", false
	}
	return a.WithZone("").String(), true
}
