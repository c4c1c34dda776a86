package scrub

import (
	"encoding/base64"
	"strings"
)

// prefixed are the vendor tokens that are a fixed prefix then a body of at
// least min bytes of an alphabet. Where one prefix starts another, the
// longer comes first.
var prefixed = []struct {
	prefix string
	min    int
	ok     func(byte) bool
	vendor string
}{
	{"ghp_", 36, isAlnum, "github"}, {"gho_", 36, isAlnum, "github"}, {"ghu_", 36, isAlnum, "github"},
	{"ghs_", 36, isAlnum, "github"}, {"ghr_", 36, isAlnum, "github"}, {"github_pat_", 40, isWord, "github"},
	{"glpat-", 20, isB64URL, "gitlab"}, {"gldt-", 20, isB64URL, "gitlab"}, {"glrt-", 20, isB64URL, "gitlab"},
	{"glptt-", 20, isB64URL, "gitlab"}, {"glcbt-", 20, isB64URL, "gitlab"}, {"glimt-", 20, isB64URL, "gitlab"},
	{"gloas-", 20, isB64URL, "gitlab"}, {"glsoat-", 20, isB64URL, "gitlab"}, {"glffct-", 20, isB64URL, "gitlab"},
	{"glft-", 20, isB64URL, "gitlab"},
	{"xapp-", 20, isAlnumDash, "slack"},
	{"sk_live_", 16, isAlnum, "stripe"}, {"sk_test_", 16, isAlnum, "stripe"}, {"rk_live_", 16, isAlnum, "stripe"},
	{"rk_test_", 16, isAlnum, "stripe"}, {"whsec_", 24, isAlnum, "stripe"},
	{"sk-ant-", 20, isB64URL, "anthropic"},
	{"sk-proj-", 20, isB64URL, "openai"}, {"sk-svcacct-", 20, isB64URL, "openai"}, {"sk-admin-", 20, isB64URL, "openai"},
	{"sk-None-", 20, isB64URL, "openai"},
	{"ya29.", 20, isB64URL, "google"}, {"GOCSPX-", 24, isB64URL, "google"},
	{"hf_", 30, isAlnum, "huggingface"},
	{"npm_", 36, isAlnum, "npm"},
	{"pypi-AgE", 47, isB64URL, "pypi"},
}

// prefixedBy lists, by first byte, the entries of prefixed to try, and
// prefixedSecond the second bytes they have: most words part from every
// prefix there.
var prefixedBy, prefixedSecond = func() (m [256][]int, second [256]string) {
	for i, p := range prefixed {
		c := p.prefix[0]
		m[c] = append(m[c], i)
		if strings.IndexByte(second[c], p.prefix[1]) < 0 {
			second[c] += p.prefix[1:2]
		}
	}
	return m, second
}()

func isAlnumDash(c byte) bool { return isAlnum(c) || c == '-' }

// vendor tries the published formats of vendors' keys and tokens at a word
// start. Each is a fixed prefix and a body of a known alphabet and length,
// so a match is specific; bodies must also end where the token does.
func (d *detector) vendor(s int) {
	t := d.text
	rest := t[s:]
	// body returns the end of a body of at least min bytes of ok after the
	// prefix, ending the token (no further alphanumeric), or -1.
	body := func(prefix, min int, ok func(byte) bool) int {
		e := runOf(t, s+prefix, ok)
		if e-(s+prefix) < min || e < len(t) && isAlnum(t[e]) {
			return -1
		}
		return e
	}
	exact := func(prefix, n int, ok func(byte) bool) int {
		e := runOf(t, s+prefix, ok)
		if e-(s+prefix) != n || e < len(t) && (isAlnum(t[e]) || t[e] == '_') {
			return -1
		}
		return e
	}
	add := func(e int, vendor string) bool {
		if e < 0 {
			return false
		}
		// A placeholder is no key; the docs' example keys
		// (AKIAIOSFODNN7EXAMPLE) are: the shape is all a scrubber can
		// know, and a real key can end the same way.
		tok := t[s:e]
		if strings.Contains(tok, "xxxxxxxx") || strings.Contains(tok, "XXXXXXXX") {
			return false
		}
		d.add(s, e, APIKey, vendor)
		return true
	}
	matched := false
	if len(rest) > 1 && strings.IndexByte(prefixedSecond[rest[0]], rest[1]) >= 0 {
		for _, i := range prefixedBy[rest[0]] {
			if p := &prefixed[i]; strings.HasPrefix(rest, p.prefix) {
				add(body(len(p.prefix), p.min, p.ok), p.vendor)
				matched = true
				break
			}
		}
	}
	switch c := t[s]; {
	case matched:
	case c == 'A':
		if len(rest) >= 20 && awsPrefix(rest[:4]) {
			if e := exact(4, 16, isUpperDigit); add(e, "aws") {
				d.awsSecretAfter(e)
				return
			}
		}
		if strings.HasPrefix(rest, "AIza") && add(exact(4, 35, isB64URL), "google") {
			return
		}
		if strings.HasPrefix(rest, "AC") {
			add(exact(2, 32, isHex), "twilio")
		}
	case c == 'S':
		if strings.HasPrefix(rest, "SG.") {
			e := runOf(t, s+3, isB64URL)
			if n := e - (s + 3); n >= 20 && n <= 24 && e < len(t) && t[e] == '.' {
				e2 := runOf(t, e+1, isB64URL)
				if n2 := e2 - (e + 1); n2 >= 40 && n2 <= 48 && !(e2 < len(t) && isAlnum(t[e2])) {
					add(e2, "sendgrid")
				}
			}
		} else if strings.HasPrefix(rest, "SK") {
			add(exact(2, 32, isHex), "twilio")
		}
	case c == 'x':
		if len(rest) > 5 && strings.HasPrefix(rest, "xox") && strings.IndexByte("abposre", rest[3]) >= 0 && rest[4] == '-' {
			if e := body(5, 10, isAlnumDash); e >= 0 && hasDigit(t[s+5:e]) {
				add(e, "slack")
			}
		}
	case c == 's':
		// OpenAI's older keys: "sk-" and a mixed body.
		if strings.HasPrefix(rest, "sk-") {
			if e := body(3, 32, isAlnum); e >= 0 && hasDigit(t[s+3:e]) && hasUpperLower(t[s+3:e]) {
				add(e, "openai")
			}
		}
	case c == 'e':
		if strings.HasPrefix(rest, "eyJ") {
			d.jwt(s)
		}
	case c == 'L':
		if strings.HasPrefix(rest, "LS0tLS1CRUdJTi") {
			d.pemBase64(s)
		}
	case c == 'b':
		// api.telegram.org/bot<token>/sendMessage
		if strings.HasPrefix(rest, "bot") && len(rest) > 4 && isDigit(rest[3]) {
			d.telegram(s + 3)
		}
	}
	d.azureKey(s)
	if t[s] == 'M' || t[s] == 'N' || t[s] == 'O' {
		d.discordBot(s)
	}
	d.azureSecret(s)
}

// awsSecretAfter: the secret access key that follows an access key id
// (within a few lines), unnamed, as in a list of both: 40 characters of
// base64, mixed case with a digit, random (a path of that length is less
// so). Alone, such a run is too like other things to take.
func (d *detector) awsSecretAfter(e int) {
	t := d.text
	end := min(len(t), e+256)
	for i := e; i < end; i++ {
		if !isB64Std(t[i]) || i > 0 && (isB64Std(t[i-1]) || t[i-1] == '=') {
			continue
		}
		j := runOf(t, i, isB64Std)
		if j-i == 40 && (j == len(t) || t[j] != '=') && hasDigit(t[i:j]) && hasUpperLower(t[i:j]) && entropy(t[i:j]) >= 4.3 {
			d.add(i, j, APIKey, "aws")
			return
		}
		i = j
	}
}

func awsPrefix(p string) bool {
	switch p {
	case "AKIA", "ASIA", "ABIA", "ACCA", "AGPA", "AIDA", "AIPA", "ANPA", "ANVA", "AROA", "APKA":
		return true
	}
	return false
}

func hasDigit(s string) bool {
	for _, c := range []byte(s) {
		if isDigit(c) {
			return true
		}
	}
	return false
}

func hasUpperLower(s string) bool {
	u, l := false, false
	for _, c := range []byte(s) {
		u = u || isUpper(c)
		l = l || isLower(c)
	}
	return u && l
}

// jwt: three base64url parts, the first two JSON objects ("eyJ").
func (d *detector) jwt(s int) {
	t := d.text
	e1 := runOf(t, s, isB64URL)
	if e1-s < 10 || e1+4 > len(t) || t[e1] != '.' || !strings.HasPrefix(t[e1+1:], "eyJ") {
		return
	}
	e2 := runOf(t, e1+1, isB64URL)
	if e2-(e1+1) < 10 || e2 >= len(t) || t[e2] != '.' {
		return
	}
	e3 := runOf(t, e2+1, isB64URL)
	if e3-(e2+1) < 10 || e3 < len(t) && t[e3] == '.' {
		return
	}
	d.add(s, e3, APIKey, "jwt")
}

// discordBot: a bot token, the bot id in base64, a timestamp and an HMAC,
// dot-separated.
func (d *detector) discordBot(s int) {
	t := d.text
	e1 := runOf(t, s, isAlnum)
	if n := e1 - s; n < 24 || n > 28 || e1 >= len(t) || t[e1] != '.' || !hasDigit(t[s:e1]) {
		return
	}
	e2 := runOf(t, e1+1, isB64URL)
	if n := e2 - (e1 + 1); n < 6 || n > 7 || e2 >= len(t) || t[e2] != '.' {
		return
	}
	e3 := runOf(t, e2+1, isB64URL)
	if n := e3 - (e2 + 1); n < 27 || n > 40 || e3 < len(t) && t[e3] == '.' {
		return
	}
	d.add(s, e3, APIKey, "discord")
}

// pemBase64: a PEM private key in base64, as Kubernetes secrets and
// kubeconfigs hold one ("LS0tLS1CRUdJTi" is "-----BEGIN ").
func (d *detector) pemBase64(s int) {
	t := d.text
	e := runOf(t, s, func(c byte) bool { return isAlnum(c) || c == '+' || c == '/' || c == '=' })
	head := t[s:min(e, s+64)]
	head = head[:len(head)/4*4]
	dec, err := base64.StdEncoding.DecodeString(head)
	if err != nil || !strings.Contains(string(dec), "PRIVATE KEY") {
		return
	}
	d.add(s, e, PrivateKey, "")
}

// azureKey: an Azure storage account key standing alone (as `az storage
// account keys list` prints it): 64 random bytes in base64, 88 characters
// ending in "==". Integrity hashes (sha512-...) are not keys.
func (d *detector) azureKey(s int) {
	t := d.text
	if s+88 > len(t) || !isB64Std(t[s+40]) || !isB64Std(t[s+85]) {
		return
	}
	e := runOf(t, s, func(c byte) bool { return isAlnum(c) || c == '+' || c == '/' })
	if e-s != 86 || !strings.HasPrefix(t[e:], "==") || e+2 < len(t) && (isAlnum(t[e+2]) || t[e+2] == '=') {
		return
	}
	for _, p := range []string{"sha512-", "sha384-", "sha256-", "sha1-"} {
		if strings.HasSuffix(t[max(0, s-len(p)):s], p) {
			return
		}
	}
	if !hasDigit(t[s:e]) || !hasUpperLower(t[s:e]) {
		return
	}
	d.add(s, e+2, APIKey, "azure")
}

func isB64Std(c byte) bool { return isAlnum(c) || c == '+' || c == '/' }

func isAzureByte(c byte) bool { return isAlnum(c) || c == '_' || c == '~' || c == '.' || c == '-' }

// azureSecret: an Entra ID (Azure AD) client secret: three characters, a
// digit, "Q~", then 31 to 34 more.
func (d *detector) azureSecret(s int) {
	t := d.text
	if s+6 > len(t) || t[s+4] != 'Q' || t[s+5] != '~' || !isDigit(t[s+3]) {
		return
	}
	if s > 0 && isAzureByte(t[s-1]) {
		return
	}
	for _, c := range []byte(t[s : s+3]) {
		if !isAzureByte(c) || c == '-' {
			return
		}
	}
	e := runOf(t, s+6, isAzureByte)
	if n := e - (s + 6); n < 31 || n > 34 {
		return
	}
	d.add(s, e, APIKey, "azure")
}
