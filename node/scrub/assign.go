package scrub

import (
	"encoding/base64"
	"math"
	"strings"
)

// nameClass says what kind of secret a name announces.
type nameClass uint8

const (
	classNone     nameClass = iota
	classPassword           // any non-trivial value is the secret
	classToken              // the value must look random
	classAuth               // an Authorization header: "Bearer <token>"
	classAzure              // an Azure storage account key
	// classFlagPassword: a password where prose is near (a flag, .netrc):
	// a plain word is not taken ("--password via the CLI").
	classFlagPassword
	// classStrict: no name says it; only a long random value is a secret.
	classStrict
)

func isNameByte(c byte) bool { return isWord(c) || c == '-' || c == '.' }

// assign looks at the name before the '=' or ':' at k and, if it says
// secret, at the value after it.
func (d *detector) assign(k int) {
	t := d.text
	if k+1 >= len(t) {
		return
	}
	switch t[k] {
	case '=':
		if t[k+1] == '=' || k > 0 && strings.IndexByte("=!<>+*/%|^~", t[k-1]) >= 0 {
			return // an operator
		}
	case ':':
		if t[k+1] == ':' || k > 0 && t[k-1] == ':' {
			return
		}
	case ',':
		// define('DB_PASSWORD', '...'), ["--requirepass", "..."]: only
		// after a quoted name.
		if k == 0 || t[k-1] != '"' && t[k-1] != '\'' {
			return
		}
	}
	// The name: spaces, a closing quote (perhaps escaped), the name.
	j := k
	for j > 0 && k-j < 8 && (t[j-1] == ' ' || t[j-1] == '\t') {
		j--
	}
	var quote byte
	if j > 0 && (t[j-1] == '"' || t[j-1] == '\'') {
		quote = t[j-1]
		j--
		if j > 0 && t[j-1] == '\\' {
			j--
		}
	}
	ne := j
	for j > 0 && ne-j < 64 && isNameByte(t[j-1]) {
		j--
	}
	ns := j
	if ns == ne || ne-ns >= 64 {
		return
	}
	if quote != 0 && (ns == 0 || t[ns-1] != quote) {
		return
	}
	if t[k] == ',' {
		// The name must open a call or an array element, not be a JSON
		// member's value: define('X', 'v'), ["--requirepass", "v"].
		b := ns - 2
		for b >= 0 && (t[b] == ' ' || t[b] == '\t') {
			b--
		}
		if quote == 0 || b < 0 || t[b] != '(' && t[b] != '[' && t[b] != ',' {
			return
		}
	}
	if ns > 0 && (t[ns-1] == '$' || t[ns-1] == '`' && t[k] == '=' && k+1 < len(t) && t[k+1] == '`') {
		return // $SONAR_TOKEN: a reference; `password=` in prose
	}
	query := ns > 0 && (t[ns-1] == '?' || t[ns-1] == '&' || t[ns-1] == ';')
	cls := classify(t[ns:ne], query)
	if cls == classNone || cls == classStrict && t[k] != '=' {
		return
	}
	d.value(k+1, cls, t[k] == ':' && quote == 0 && !query, query)
}

// flag looks at a command-line flag at i ("--password VALUE").
func (d *detector) flag(i int) {
	t := d.text
	ne := runOf(t, i+2, func(c byte) bool { return isAlnum(c) || c == '-' || c == '_' })
	if ne >= len(t) || t[ne] != ' ' || ne-i > 40 {
		return // "--password=VALUE" is an assignment
	}
	cls := classify(t[i+2:ne], false)
	if cls == classNone || cls == classAuth {
		return
	}
	v := ne + 1
	if v >= len(t) || t[v] == '-' || t[v] == ' ' {
		return
	}
	if cls == classPassword {
		cls = classFlagPassword
	}
	d.value(v, cls, false, false)
}

// spaced looks at a word followed by white space and what comes after:
// SQL's PASSWORD 'x' and IDENTIFIED BY 'x', .netrc's "login u password p",
// nginx's Authorization "Bearer t", and identifiers that say secret before
// a random value ("aws configure set aws_secret_access_key VALUE").
func (d *detector) spaced(s, e int) {
	t := d.text
	v := e
	for v < len(t) && v-e < 8 && (t[v] == ' ' || t[v] == '\t') {
		v++
	}
	if v >= len(t) || v == e {
		return
	}
	quoted := t[v] == '\'' || t[v] == '"'
	w := t[s:e]
	switch {
	case strings.EqualFold(w, "identified"):
		if v+3 <= len(t) && strings.EqualFold(t[v:v+3], "by ") {
			v += 3
			if v < len(t) && (t[v] == '\'' || t[v] == '"') {
				d.value(v, classPassword, false, false)
			}
		}
	case strings.EqualFold(w, "password") || strings.EqualFold(w, "passwd"):
		if quoted {
			d.value(v, classPassword, false, false)
		} else if netrcContext(t, s) {
			d.value(v, classFlagPassword, false, false)
		}
	case strings.EqualFold(w, "authorization"):
		if quoted {
			d.value(v, classAuth, false, false)
		}
	case strings.ContainsAny(w, "_-") && !quoted:
		if c := classify(t[s:e], false); c == classToken || c == classPassword {
			d.value(v, classStrict, false, false)
		}
	}
}

// netrcContext: the word at s starts its line, or follows "login X" on it.
func netrcContext(t string, s int) bool {
	ls := strings.LastIndexByte(t[:s], '\n') + 1
	line := t[ls:s]
	return strings.TrimSpace(line) == "" || strings.Contains(line, "login ")
}

// xmlElement looks at an element <NAME>value</NAME> at i (the '<') whose
// name says secret.
func (d *detector) xmlElement(i int) {
	t := d.text
	e := runOf(t, i+1, func(c byte) bool { return isWord(c) || c == '-' || c == '.' || c == ':' })
	if e >= len(t) || t[e] != '>' || e-i > 48 {
		return
	}
	cls := classify(t[i+1:e], false)
	if cls == classNone || cls == classAuth {
		return
	}
	vs := e + 1
	ve := strings.Index(t[vs:min(len(t), vs+4096)], "</")
	if ve < 0 {
		return
	}
	ve += vs
	if secretValue(t[vs:ve], cls, true) {
		d.add(vs, ve, Secret, "")
	}
}

// value reads the value at v (after optional spaces) and adds it if it looks
// like a secret of class cls. wholeLine asks that an unquoted value end its
// line, as in YAML, so that prose ("Token: the unit of text") is not taken.
func (d *detector) value(v int, cls nameClass, wholeLine, query bool) {
	t := d.text
	for v < len(t) && (t[v] == ' ' || t[v] == '\t') {
		v++
	}
	if v >= len(t) {
		return
	}
	// []byte("..."), String("..."), b"...": the literal inside.
	if q := strings.IndexAny(t[v:min(len(t), v+16)], "\"'"); q > 0 && t[v] != '\\' && isCallPrefix(t[v:v+q]) {
		v += q
	}
	quoted := false
	var vs, ve int
	switch q := t[v]; {
	case q == '"' || q == '\'' || q == '`':
		vs = v + 1
		e := closingQuote(t, vs, q, false)
		if e < 0 {
			return
		}
		ve, quoted = e, true
	case q == '\\' && v+1 < len(t) && t[v+1] == '"':
		vs = v + 2
		e := closingQuote(t, vs, '"', true)
		if e < 0 {
			return
		}
		ve, quoted = e, true
	default:
		vs = v
		ve = vs
		for ve < len(t) && ve-vs < 4096 && !isValueStop(t[ve]) && !(query && t[ve] == '&') {
			ve++
		}
		if ve < len(t) && ve-vs >= 4096 {
			return
		}
		for ve > vs && (t[ve-1] == '.' || t[ve-1] == ',') && (ve == len(t) || t[ve] == ' ' || t[ve] == '\n' || t[ve] == '\r') {
			ve-- // the end of a sentence
		}
	}
	if cls == classAuth {
		// "Bearer TOKEN", "Basic BASE64", "token TOKEN"
		sp := strings.IndexByte(t[vs:ve], ' ')
		if !quoted {
			// The scheme ended the unquoted value; the credential follows.
			if ve >= len(t) || t[ve] != ' ' {
				return
			}
			sp = ve - vs
			ve = ve + 1
			for ve < len(t) && !isValueStop(t[ve]) {
				ve++
			}
		}
		if sp < 0 {
			return
		}
		switch strings.ToLower(t[vs : vs+sp]) {
		case "bearer", "basic", "token", "bot", "digest", "apikey", "sso-key":
		default:
			return
		}
		vs += sp + 1
		cls = classToken
		if strings.IndexByte(t[vs:ve], ' ') >= 0 {
			return
		}
	}
	val := t[vs:ve]
	if !quoted && wholeLine && !secretValue(val, classStrict, false) {
		// In prose a colon ends many words; take a plain value only when
		// it ends its line (YAML), unless it is random enough to be a
		// secret anywhere.
		e := ve
		for e < len(t) && (t[e] == ' ' || t[e] == '\t') {
			e++
		}
		if e < len(t) && strings.IndexByte("\n\r,;}])#\"'\\", t[e]) < 0 {
			return
		}
	}
	if quoted && (strings.HasPrefix(val, " ") || strings.HasSuffix(val, " ")) {
		return
	}
	if !secretValue(val, cls, quoted) {
		return
	}
	kind, detail := Secret, ""
	if cls == classAzure {
		kind, detail = APIKey, "azure"
	}
	d.add(vs, ve, kind, detail)
}

// closingQuote returns the index of the quote closing a string that starts
// at s, on the same line, or -1. escaped asks for \" (a string inside a JSON
// string).
func closingQuote(t string, s int, q byte, escaped bool) int {
	for i := s; i < len(t) && i-s < 4096; i++ {
		c := t[i]
		switch {
		case c == '\n' || c == '\r':
			return -1
		case escaped && c == '\\' && i+1 < len(t) && t[i+1] == q:
			return i
		case !escaped && c == '\\':
			i++
		case !escaped && c == q:
			return i
		}
	}
	return -1
}

func isValueStop(c byte) bool {
	switch c {
	case ' ', '\t', '\n', '\r', '"', '\'', '`', ',', ';', ')', '}', ']', '<', '>', '|', '\\':
		return true
	}
	return c < 0x20
}

// isCallPrefix reports the start of a call or conversion around a string
// literal: "[]byte(", "String(", "b", "r", "os.Getenv("... no: only
// conversions of a literal, which end in '(' or are a one-letter prefix.
func isCallPrefix(p string) bool {
	if len(p) == 1 {
		return p == "b" || p == "r" || p == "u" || p == "f"
	}
	if !strings.HasSuffix(p, "(") {
		return false
	}
	for _, c := range []byte(p[:len(p)-1]) {
		if !isWord(c) && c != '[' && c != ']' && c != '.' {
			return false
		}
	}
	l := strings.ToLower(p)
	return !strings.Contains(l, "env") && !strings.Contains(l, "get") && !strings.Contains(l, "read") && !strings.Contains(l, "load")
}

// nameWords splits a name into lower-case words at '_', '-', '.', and
// lower-to-upper case changes: "AWS_SECRET_ACCESS_KEY" → aws secret access
// key, "clientSecret" → client secret, "APIKey" → api key.
func nameWords(name string, buf []string) []string {
	w := buf[:0]
	start := -1
	flush := func(i int) {
		if start >= 0 && i > start {
			w = append(w, strings.ToLower(name[start:i]))
		}
		start = -1
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !isAlnum(c) {
			flush(i)
			continue
		}
		if start >= 0 && isUpper(c) && (isLower(name[i-1]) || i+1 < len(name) && isLower(name[i+1]) && isUpper(name[i-1])) {
			flush(i)
		}
		if start < 0 {
			start = i
		}
	}
	flush(len(name))
	return w
}

// secretHint is a cheap first test: a name that says secret contains one of
// these (case-insensitively).
var secretHints = []string{"pass", "pwd", "secret", "token", "key", "auth", "cred", "sig", "bearer", "cookie"}

// metaWords end names that are about a secret rather than one:
// password_min_length, token_url, secretName.
var metaWords = map[string]bool{
	"length": true, "len": true, "min": true, "max": true, "count": true, "policy": true, "file": true,
	"path": true, "dir": true, "url": true, "uri": true, "endpoint": true, "type": true, "name": true,
	"id": true, "ttl": true, "expiry": true, "expires": true, "expiration": true, "timeout": true,
	"enabled": true, "enable": true, "required": true, "hint": true, "prompt": true, "label": true,
	"field": true, "format": true, "env": true, "var": true, "header": true, "mode": true,
	"strength": true, "rotation": true, "version": true, "limit": true, "size": true, "hash": true,
	"ref": true, "source": true, "store": true, "provider": true, "manager": true, "regex": true,
	"pattern": true, "placeholder": true, "prefix": true, "suffix": true, "scope": true, "scopes": true,
	"reset": true, "changed": true, "set": true, "valid": true, "age": true, "usage": true, "index": true,
	"length_min": true, "used": true, "bits": true, "algorithm": true, "alg": true, "kind": true,
	"location": true, "status": true, "secrets": true, "command": true, "cmd": true, "help": true,
}

// keyOwners are the words that make a following "key" a secret one.
var keyOwners = map[string]bool{
	"api": true, "access": true, "secret": true, "private": true, "signing": true, "encryption": true,
	"master": true, "account": true, "client": true, "auth": true, "license": true, "app": true,
	"service": true, "subscription": true, "x": true, "session": true, "shared": true, "storage": true,
	"consumer": true, "webhook": true, "admin": true, "write": true, "read": true, "deploy": true,
	"hmac": true, "jwt": true, "crypt": true, "encrypt": true, "cipher": true, "openai": true,
	"anthropic": true, "stripe": true, "sendgrid": true, "mailgun": true, "twilio": true, "google": true,
}

// classify says whether a name announces a secret. query is true for a
// name in a URL's query string, where "key" and "sig" alone do.
func classify(name string, query bool) nameClass {
	name = strings.TrimLeft(name, "-$@._")
	if name == "" {
		return classNone
	}
	var lb [64]byte
	lower := lb[:0]
	for _, c := range []byte(name) {
		if isUpper(c) {
			c += 'a' - 'A'
		}
		lower = append(lower, c)
	}
	ls := string(lower)
	hinted := false
	for _, h := range secretHints {
		if strings.Contains(ls, h) {
			hinted = true
			break
		}
	}
	if !hinted {
		return classNone
	}
	var wb [16]string
	words := nameWords(name, wb[:])
	if len(words) == 0 || metaWords[words[len(words)-1]] {
		return classNone
	}
	joined := strings.Join(words, "")
	switch {
	case joined == "authorization" || joined == "proxyauthorization":
		return classAuth
	case strings.HasSuffix(joined, "accountkey"):
		return classAzure
	}
	cls := classNone
	for i, w := range words {
		switch w {
		case "password", "passwd", "pwd", "pass", "passphrase", "passcode", "pw":
			return classPassword
		case "secret", "token", "apikey", "accesskey", "secretkey", "privatekey", "authtoken",
			"accesstoken", "refreshtoken", "credential", "credentials", "creds", "bearer", "sessionkey",
			"clientsecret", "apitoken", "authkey", "cookie", "sessionid", "sessiontoken", "salt":
			cls = classToken
		case "key":
			switch {
			case i > 0 && words[i-1] == "access":
				// An access key id names a credential: whatever its value
				// looks like (minio-bot), it is half of one.
				return classPassword
			case i > 0 && keyOwners[words[i-1]] || query && len(words) == 1:
				cls = classToken
			}
		case "auth":
			if i == len(words)-1 {
				cls = classToken
			}
		case "sig", "signature":
			if query {
				cls = classToken
			}
		default:
			// pgpassword, requirepass, secretapikey: run together.
			switch {
			case strings.HasSuffix(w, "password") || strings.HasSuffix(w, "passwd") || strings.HasSuffix(w, "pass") && len(w) > 6:
				return classPassword
			case strings.Contains(w, "secret") || strings.Contains(w, "apikey") || strings.Contains(w, "accesskey") ||
				strings.Contains(w, "privatekey") || strings.HasSuffix(w, "token"):
				cls = classToken
			}
		}
	}
	if cls == classNone && len(words) == 1 && words[0] == "key" {
		return classStrict // key = <random>, as rclone and others write it
	}
	return cls
}

// placeholderWords are values that stand for a secret without being one.
var placeholderWords = map[string]bool{
	"null": true, "nil": true, "none": true, "true": true, "false": true, "yes": true, "no": true,
	"on": true, "off": true, "undefined": true, "required": true, "optional": true, "string": true,
	"str": true, "int": true, "bool": true, "passwd": true, "secret": true,
	"token": true, "apikey": true, "api_key": true, "key": true, "value": true, "example": true,
	"dummy": true, "hidden": true, "masked": true, "redacted": true, "removed": true, "unset": true,
	"empty": true, "env": true, "default": true, "auto": true, "bearer": true, "basic": true,
	"enabled": true, "disabled": true, "encrypted": true, "n/a": true, "na": true, "tbd": true, "todo": true,
	"sensitive": true, "<redacted>": true, "secretref": true, "prompt": true, "ask": true, "file": true,
}

// secretValue reports whether v, assigned to a name of class cls, looks
// like an actual secret rather than a reference to one (${DB_PASSWORD},
// os.environ[...]), a placeholder (<your-key>, xxxx, REDACTED) or a setting
// (true, 4096).
func secretValue(v string, cls nameClass, quoted bool) bool {
	if len(v) < 3 || len(v) > 4096 || strings.ContainsAny(v, "\n\r") {
		return false
	}
	switch v[0] {
	case '$', '%', '<', '{', '@', '[', '(', '*', '#', '&', '!', '.', '/':
		if !(quoted && cls == classPassword && v[0] != '$' && v[0] != '<' && v[0] != '{' && v[0] != '%') && cls != classAzure {
			return false
		}
	}
	if placeholderLen(v) == len(v) {
		return false
	}
	lv := strings.ToLower(v)
	if placeholderWords[lv] || lv == "password" && cls != classPassword {
		return false
	}
	for _, s := range []string{"${", "{{", "}}", "$(", "os.environ", "process.env", "getenv", "env(", "env.", "redacted", "placeholder", "your_", "your-", "yourpass", "your ", "<your", "xxxx", "****", "…", "...", "change_me_later", "masked"} {
		if strings.Contains(lv, s) {
			return false
		}
	}
	if strings.Contains(lv, "example") && !randomLooking(v) {
		// "example-password" stands for one; the docs' example keys
		// (wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY) are shaped like one
		// and go as one.
		return false
	}
	if allSame(v) {
		return false
	}
	if dataURI(lv) {
		return false // "secret: data:text/plain;base64,...": content inline, not a key
	}
	if !quoted && (strings.ContainsAny(v, "()[]") || isReference(v)) {
		return false
	}
	switch cls {
	case classPassword:
		if !quoted && strings.HasPrefix(lv, "your") {
			return false
		}
		return true
	case classFlagPassword:
		// Not a plain lower-case word: "via", "from", "prompt".
		return len(v) >= 4 && (hasDigit(v) || hasUpperLower(v) || strings.ContainsAny(v, "!@#$%^&*-_+=.?~"))
	case classStrict:
		return len(v) >= 16 && !strings.ContainsAny(v, " ") && hasDigit(v) && (hasUpperLower(v) || isHexString(v)) && entropy(v) >= 3.3
	default:
		if base64Text(v) {
			return true // "dGVzdA==": a short secret, encoded
		}
		if len(v) < 8 {
			return false
		}
		if strings.IndexByte(v, ' ') >= 0 {
			return false
		}
		if allDigits(v) && len(v) < 16 {
			return false
		}
		if !hasDigit(v) && !hasUpperLower(v) && !strings.ContainsAny(v, "+/=") {
			return false // a plain word: "enabled", "etl-db-url"
		}
		return entropy(v) >= 2.8
	}
}

// dataURI reports a value (lower-cased) that starts a data: URI with its
// media type, "data:text/plain" or "data:image/png;base64,...".
func dataURI(lv string) bool {
	rest, ok := strings.CutPrefix(lv, "data:")
	if !ok {
		return false
	}
	typ, sub, ok := strings.Cut(rest, "/")
	if !ok || typ == "" || sub == "" {
		return false
	}
	for _, c := range []byte(typ) {
		if !isAlpha(c) {
			return false
		}
	}
	return isAlpha(sub[0])
}

// randomLooking reports a value long and mixed enough to be a generated
// key, whatever words it holds.
func randomLooking(v string) bool {
	return len(v) >= 16 && hasDigit(v) && hasUpperLower(v) && entropy(v) >= 3.5
}

// base64Text reports a value of 8 to 44 characters that is standard base64
// of printable text: how a short password or token is written in a
// Kubernetes secret or a config file ("c2VjcmV0MTIz", "dGVzdA=="). Too
// short to be random enough for the entropy test, it is recognised by
// decoding: a word ("Password") does not decode to text.
func base64Text(v string) bool {
	if len(v) < 8 || len(v) > 44 || len(v)%4 != 0 {
		return false
	}
	var buf [33]byte
	n, err := base64.StdEncoding.Decode(buf[:], []byte(v))
	if err != nil || n < 4 {
		return false
	}
	for _, c := range buf[:n] {
		if c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}

func isHexString(s string) bool {
	for _, c := range []byte(s) {
		if !isHex(c) {
			return false
		}
	}
	return true
}

// isReference reports an unquoted value that names a variable or constant:
// config.db.password, settings.SECRET_KEY, API_KEY.
func isReference(v string) bool {
	segs := strings.Split(v, ".")
	for _, s := range segs {
		if s == "" || !isAlpha(s[0]) && s[0] != '_' {
			return false
		}
		for _, c := range []byte(s) {
			if !isWord(c) {
				return false
			}
		}
	}
	if len(segs) > 1 {
		switch strings.ToLower(segs[0]) {
		case "self", "this", "config", "cfg", "conf", "settings", "env", "os", "process", "args", "opts",
			"options", "params", "request", "req", "ctx", "secrets", "vars", "props", "credentials", "creds", "app", "keys":
			return true
		}
		return false
	}
	// An ALL_CAPS_NAME with an underscore is a constant or variable name.
	return strings.IndexByte(v, '_') > 0 && !hasLowerByte(v) && !hasDigit(v)
}

func hasLowerByte(s string) bool {
	for _, c := range []byte(s) {
		if isLower(c) {
			return true
		}
	}
	return false
}

func allSame(s string) bool {
	for i := 1; i < len(s); i++ {
		if s[i] != s[0] {
			return false
		}
	}
	return true
}

func allDigits(s string) bool {
	for _, c := range []byte(s) {
		if !isDigit(c) {
			return false
		}
	}
	return true
}

// entropy is the Shannon entropy of s's bytes, in bits per byte.
func entropy(s string) float64 {
	var n [256]int
	for _, c := range []byte(s) {
		n[c]++
	}
	h := 0.0
	for _, k := range n {
		if k > 0 {
			p := float64(k) / float64(len(s))
			h -= p * math.Log2(p)
		}
	}
	return h
}
