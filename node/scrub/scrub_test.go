package scrub

import (
	"strings"
	"testing"
)

// TestFind: each kind in the shapes it takes, and text that must come out
// unchanged. The labelled corpus (corpus package) measures recall and
// precision at scale; these pin the rules down one by one.
func TestFind(t *testing.T) {
	s, err := New(Options{Names: []string{"Alice Zhou", "Project Falcon", "周杰"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		in, want string
	}{
		// e-mail
		{"mail alice.zhou@example.org.", "mail <EMAIL_1>."},
		{"<bob+tag@mail.co.uk>", "<<EMAIL_1>>"},
		{"git@github.com:org/repo.git lodash@4.17.21 @Override npm i @scope/pkg node@24", "git@github.com:org/repo.git lodash@4.17.21 @Override npm i @scope/pkg node@24"},
		{"ssh://git@host.example.com/x", "ssh://git@host.example.com/x"},
		// phones
		{"call +44 20 7946 0958 or +1-415-555-0132", "call <PHONE_1> or <PHONE_2>"},
		{"(415) 555-0132, 415.555.0132, 020 7946 0958, 07700 900123, 01 23 45 67 89", "<PHONE_1>, <PHONE_1>, <PHONE_2>, <PHONE_3>, <PHONE_4>"},
		{"+86 138 0013 8000 and 138 0013 8000", "<PHONE_1> and <PHONE_2>"},
		{"tel: 4155550132", "tel: <PHONE_1>"},
		{"2024-01-15 12:30:45 978-3-16-148410-0 555-0132 1,234,567 3.14159", "2024-01-15 12:30:45 978-3-16-148410-0 555-0132 1,234,567 3.14159"},
		{"id 4155550132 and 1732540800", "id 4155550132 and 1732540800"},
		// IP
		{"from 192.168.1.23:8080 and 10.0.0.0/8", "from <IP_1>:8080 and <IP_2>/8"},
		{"[2001:db8::8a2e:370:7334]:443 fe80::1ff:fe23:4567:890a%eth0", "[<IP_1>]:443 <IP_2>"},
		{"127.0.0.1 0.0.0.0 ::1 :: 255.255.255.0 version 1.2.3.4 v10.0.0.1 Chrome/120.0.6099.109 1.3.6.1.4.1 std::vector 12:30:45 00:1a:2b:3c:4d:5e",
			"127.0.0.1 0.0.0.0 ::1 :: 255.255.255.0 version 1.2.3.4 v10.0.0.1 Chrome/120.0.6099.109 1.3.6.1.4.1 std::vector 12:30:45 00:1a:2b:3c:4d:5e"},
		{"server 10.1.2.3 up", "server <IP_1> up"},
		// URLs
		{"postgres://app:s3cr3tP4ss@db.internal:5432/app", "postgres://<CREDENTIAL_1>@db.internal:5432/app"},
		{"postgres://app:${DB_PASS}@db/app https://user@example.com/", "postgres://app:${DB_PASS}@db/app https://user@example.com/"},
		{"https://x.io/cb?code=1&access_token=ya7Hq2Lr9xPq0Zt&sig=aB3dE5fG7hI9jK", "https://x.io/cb?code=1&access_token=<SECRET_1>&sig=<SECRET_2>"},
		{"https://hooks.slack.com/services/T0A1B2C3D/B0A1B2C3D/aBcDeFgHiJkLmNoPqRsTuVwX done", "<API_KEY_1> done"},
		{"https://example.com/home/about", "https://example.com/home/about"},
		// assignments
		{"DB_PASSWORD=hunter2 ./run", "DB_PASSWORD=<SECRET_1> ./run"},
		{`{"password": "s3cret!", "api_key": "${API_KEY}", "token": "REDACTED"}`, `{"password": "<SECRET_1>", "api_key": "${API_KEY}", "token": "REDACTED"}`},
		{"password: changeme\nmax_tokens: 4096\ntokenizer: qwen3\npassword_min_length: 8\nuse_token: true", "password: <SECRET_1>\nmax_tokens: 4096\ntokenizer: qwen3\npassword_min_length: 8\nuse_token: true"},
		{`curl -H "Authorization: Bearer abcdef1234567890XYZ" https://api`, `curl -H "Authorization: Bearer <SECRET_1>" https://api`},
		{"mysql --password s3cr3t-Pa55 db", "mysql --password <SECRET_1> db"},
		{"client_secret = os.environ['CLIENT_SECRET'] and secret = config.secret", "client_secret = os.environ['CLIENT_SECRET'] and secret = config.secret"},
		{"Token: the unit of text a model reads", "Token: the unit of text a model reads"},
		{"if token == expected and password != ''", "if token == expected and password != ''"},
		// vendors
		{"AKIAIOSFODNN7EXAMPL3 ghp_abcdefghijklmnopqrstuvwxyz0123456789 sk-proj-abcDEF123_ghiJKL456-mnoPQR789", "<API_KEY_1> <API_KEY_2> <API_KEY_3>"},
		{"GITHUB_TOKEN=ghp_abcdefghijklmnopqrstuvwxyz0123456789", "GITHUB_TOKEN=<API_KEY_1>"},
		{"eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U", "<API_KEY_1>"},
		{"123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw1 done", "<API_KEY_1> done"},
		{"sk-learn ghp_short AKIA task-force hf_hub_download", "sk-learn ghp_short AKIA task-force hf_hub_download"},
		// PEM
		{"-----BEGIN RSA PRIVATE KEY-----\nMIIEabc+/=\n-----END RSA PRIVATE KEY-----\nafter", "<PRIVATE_KEY_1>\nafter"},
		{`"k": "-----BEGIN EC PRIVATE KEY-----\nMHcCAQ\n-----END EC PRIVATE KEY-----"`, `"k": "<PRIVATE_KEY_1>"`},
		{"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"},
		// cards, IBANs, SSNs
		{"4111 1111 1111 1111, 5500-0000-0000-0004, 378282246310005", "<CARD_1>, <CARD_2>, <CARD_3>"},
		{"4111111111111112 1732540800000", "4111111111111112 1732540800000"},
		{"GB82 WEST 1234 5698 7654 32 and DE89370400440532013000 not DEUTDEFF or GB00WEST12345698765432", "<IBAN_1> and <IBAN_2> not DEUTDEFF or GB00WEST12345698765432"},
		{"SSN 123-45-6789; not 000-12-3456 or 2024-01-15", "SSN <SSN_1>; not 000-12-3456 or 2024-01-15"},
		// home directories
		{`File "/home/alice/proj/x.py" /Users/bob/.ssh C:\Users\Ada Lovelace\Documents`, `File "/home/<USER_1>/proj/x.py" /Users/<USER_2>/.ssh C:\Users\<USER_3>\Documents`},
		{`"C:\\Users\\carol\\AppData" C:/Users/dave/x`, `"C:\\Users\\<USER_1>\\AppData" C:/Users/<USER_2>/x`},
		{"/Users/Shared/x C:\\Users\\Public\\y ~/z /root/w $HOME/v", "/Users/Shared/x C:\\Users\\Public\\y ~/z /root/w $HOME/v"},
		// names
		{"Alice Zhou met ALICE\n  zhou about project falcon; Alicez no; 周杰说", "<NAME_1> met <NAME_1> about <NAME_2>; Alicez no; <NAME_3>说"},
		// ordinary text
		{"uuid 123e4567-e89b-12d3-a456-426614174000 sha 3f786850e387550fdab836ed7e6dc881de23001b at 0x7ffd5a3c main.go:42:7 in 1.5s",
			"uuid 123e4567-e89b-12d3-a456-426614174000 sha 3f786850e387550fdab836ed7e6dc881de23001b at 0x7ffd5a3c main.go:42:7 in 1.5s"},
	} {
		var tb Table
		if got := s.Text(&tb, c.in); got != c.want {
			t.Errorf("Text(%q)\n got %q\nwant %q", c.in, got, c.want)
		}
	}
}

// TestTableConsistent: one value keeps its placeholder across texts of the
// table, however it is written; another value gets the next number; a
// fresh table starts again.
func TestTableConsistent(t *testing.T) {
	s, _ := New(Options{})
	var tb Table
	a := s.Text(&tb, "from Alice@Example.org to bob@example.org")
	b := s.Text(&tb, "reply to alice@example.org, +1 415 555 0132")
	c := s.Text(&tb, "or (415) 555-0132?")
	if a != "from <EMAIL_1> to <EMAIL_2>" || b != "reply to <EMAIL_1>, <PHONE_1>" {
		t.Errorf("got %q, %q", a, b)
	}
	if c != "or <PHONE_2>?" {
		// Without the country code the digits differ: another number as
		// far as the table can tell.
		t.Errorf("got %q", c)
	}
	if got := tb.Counts(); got[Email] != 3 || got[Phone] != 2 {
		t.Errorf("counts %v", got)
	}
	if got := tb.Distinct(); got[Email] != 2 {
		t.Errorf("distinct %v", got)
	}
	var fresh Table
	if got := s.Text(&fresh, "bob@example.org"); got != "<EMAIL_1>" {
		t.Errorf("a fresh table: %q", got)
	}
}

// TestIdempotent: scrubbing scrubbed text changes nothing, with the same
// table or a fresh one.
func TestIdempotent(t *testing.T) {
	s, _ := New(Options{Names: []string{"Alice", "EMAIL"}})
	in := "Alice <alice@x.org> password=hunter2 /home/alice/x 10.0.0.1 <EMAIL_1> <TOOL_RESULT_WITHHELD> token: <SECRET_9>"
	var tb Table
	once := s.Text(&tb, in)
	if twice := s.Text(&tb, once); twice != once {
		t.Errorf("same table: %q → %q", once, twice)
	}
	var fresh Table
	if twice := s.Text(&fresh, once); twice != once {
		t.Errorf("fresh table: %q → %q", once, twice)
	}
	if strings.Contains(once, "alice") {
		t.Errorf("left something: %q", once)
	}
}

// TestPass: a Pass reuses the findings of a long text it has seen, and
// gives the same output as a fresh scan.
func TestPass(t *testing.T) {
	s, _ := New(Options{})
	long := strings.Repeat("system prompt line with nothing in it. ", 40) + " mail ops@example.com"
	p := s.NewPass()
	var t1, t2 Table
	a := p.Text(&t1, long)
	b := p.Text(&t2, long)
	if a != b || a != s.Text(&Table{}, long) || !strings.HasSuffix(a, "<EMAIL_1>") {
		t.Errorf("pass output differs: %q / %q", a[len(a)-20:], b[len(b)-20:])
	}
	if p.Scanned != int64(len(long)) || p.Reused != int64(len(long)) {
		t.Errorf("scanned %d, reused %d; want %d each", p.Scanned, p.Reused, len(long))
	}
}

func TestNamesRefused(t *testing.T) {
	for _, n := range []string{"A", " ", "<EMAIL_1>", strings.Repeat("x", 201)} {
		if _, err := New(Options{Names: []string{n}}); err == nil {
			t.Errorf("name %q accepted", n)
		}
	}
}

func TestChecks(t *testing.T) {
	for _, c := range []struct {
		n    string
		want bool
	}{{"4111111111111111", true}, {"4111111111111112", false}, {"378282246310005", true}, {"79927398713", true}} {
		if got := luhn([]byte(c.n)); got != c.want {
			t.Errorf("luhn(%s) = %v", c.n, got)
		}
	}
	for _, c := range []struct {
		n    string
		want bool
	}{{"GB82WEST12345698765432", true}, {"DE89370400440532013000", true}, {"GB83WEST12345698765432", false}, {"NL91ABNA0417164300", true}} {
		if got := mod97([]byte(c.n)); got != c.want {
			t.Errorf("mod97(%s) = %v", c.n, got)
		}
	}
}

// TestFindWrittenOtherwise: personal data and secrets in the other ways
// they are written (national phone formats, ids with spaces, encoded in a
// URL, the docs' example keys, short secrets in base64), each beside a
// look-alike that must stay.
func TestFindWrittenOtherwise(t *testing.T) {
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, in, want string
	}{
		// national phone formats
		{"area code slash", "ruf 030/12345678 an, Büro 089 / 123 456 oder 0172 / 987 65 43",
			"ruf <PHONE_1> an, Büro <PHONE_2> oder <PHONE_3>"},
		{"trunk prefix", "+44 (0)20 7946 0958, (0)20 7946 0958, +49 (0)89 123456-78, (0) 69 9876 5432",
			"<PHONE_1>, <PHONE_2>, <PHONE_3>, <PHONE_4>"},
		{"french", "01 23 45 67 89 or 0 800 12 34 56 or 0 805 123 456", "<PHONE_1> or <PHONE_2> or <PHONE_3>"},
		{"country code run in", "+4930123456, 0049301234567, +33612345678, 0044 20 7946 0958",
			"<PHONE_1>, <PHONE_2>, <PHONE_3>, <PHONE_4>"},
		{"phone look-alikes", "pages 030/120, 03/11/2026, /spool/0800/1234, seq=000123456789, 0049-301-2345-67, 0/15, (0) 1 2 3, 0 800 1 2",
			"pages 030/120, 03/11/2026, /spool/0800/1234, seq=000123456789, 0049-301-2345-67, 0/15, (0) 1 2 3, 0 800 1 2"},
		{"uk freephone", "support 0 800 123 4567 or 0 808 157 0192", "support <PHONE_1> or <PHONE_2>"},
		{"codes, not phones", "the lot number is 0301-2345-6789-A; build 0301-2345-6789; serial 0161 496 0000; part 0800-112-2334-X",
			"the lot number is 0301-2345-6789-A; build 0301-2345-6789; serial 0161 496 0000; part 0800-112-2334-X"},
		{"a code word, then a phone", "build failed: call 0161 496 0000", "build failed: call <PHONE_1>"},
		// section numbers and data: URIs
		{"sections, not addresses", "section 4.3.2.1, § 10.2.3.4, clause 2.1.1.7, table 3.2.1.4; host 81.2.69.160",
			"section 4.3.2.1, § 10.2.3.4, clause 2.1.1.7, table 3.2.1.4; host <IP_1>"},
		{"data: after secret", "not a secret: data:text/plain;base64,SGVsbG8sIHdvcmxkIQ==\nsecret: data:image/png;base64,iVBORw0KGgo=\nsecret: d4t4Zx91kLmQ2pRs",
			"not a secret: data:text/plain;base64,SGVsbG8sIHdvcmxkIQ==\nsecret: data:image/png;base64,iVBORw0KGgo=\nsecret: <SECRET_1>"},
		// identity numbers with spaces
		{"ni numbers", "NI QQ 12 34 56 C, nino=AB123456D, {\"ni\": \"ZR 90 11 42 A\"}",
			"NI <NI_NUMBER_1>, nino=<NI_NUMBER_2>, {\"ni\": \"<NI_NUMBER_3>\"}"},
		{"ni look-alikes", "TN123456A GB123456A AB123456E AO 12 34 56 C DQ123456A XAB123456C AB1234567C AB 12 3456 C",
			"TN123456A GB123456A AB123456E AO 12 34 56 C DQ123456A XAB123456C AB1234567C AB 12 3456 C"},
		{"ssn spaced", "SSN 123 45 6789; social security number: 078 05 1120; {\"ssn\": \"536 22 1987\"}",
			"SSN <SSN_1>; social security number: <SSN_2>; {\"ssn\": \"<SSN_3>\"}"},
		{"ids grouped", "IBAN DE44 5001 0517 5407 3249 31, card 4539 8997 2074 3225, Amex 3714 825396 72858",
			"IBAN <IBAN_1>, card <CARD_1>, Amex <CARD_2>"},
		{"ssn look-alikes", "dims 123 45 6789, SSN 000 12 3456, matrix 512 16 2048, classname 123 45 6789",
			"dims 123 45 6789, SSN 000 12 3456, matrix 512 16 2048, classname 123 45 6789"},
		// percent-encoded in URLs
		{"encoded address", "mailto:jane%40example.com?subject=Hi https://x.example/c?email=jane.doe%40corp.example&limit=20",
			"mailto:<EMAIL_1>?subject=Hi https://x.example/c?email=<EMAIL_2>&limit=20"},
		{"encoded phone", "https://x.example/lookup?phone=%2B4930123456789&country=DE tel=%2b447700900789",
			"https://x.example/lookup?phone=<PHONE_1>&country=DE tel=<PHONE_2>"},
		{"encoded in a query", "https://x.example/s?q=from%3Djane%40example.com&page=2",
			"https://x.example/s?q=from%3D<EMAIL_1>&page=2"},
		{"encoded look-alikes", "q=50%25%20off user%40 is empty, %2B alone, %2B12, next=%2Fdashboard%3Ftab%3D2",
			"q=50%25%20off user%40 is empty, %2B alone, %2B12, next=%2Fdashboard%3Ftab%3D2"},
		// the docs' example credentials
		{"aws example", "aws_access_key_id = AKIAIOSFODNN7EXAMPLE\naws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
			"aws_access_key_id = <API_KEY_1>\naws_secret_access_key = <API_KEY_2>"},
		{"aws example pair", "allow: ['AKIAIOSFODNN7EXAMPLE', 'wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY']",
			"allow: ['<API_KEY_1>', '<API_KEY_2>']"},
		{"aws key then a path", "AKIAI2V7ICB4WTCBE4ET in src/components/Header/Index2Test/fooBar1",
			"<API_KEY_1> in src/components/Header/Index2Test/fooBar1"},
		{"stripe and github examples", "sk_test_4eC39HqLyjWDarjtT1zdp7dc GH_TOKEN=ghp_ExampleToken1234567890abcdefghijklmn",
			"<API_KEY_1> GH_TOKEN=<API_KEY_2>"},
		{"example look-alikes", "AKIAXXXXXXXXXXXXXXXX sk_test_xxxxxxxxxxxxxxxxxxxxxxxx password: example\napi_key=example-key AKIA...EXAMPLE",
			"AKIAXXXXXXXXXXXXXXXX sk_test_xxxxxxxxxxxxxxxxxxxxxxxx password: example\napi_key=example-key AKIA...EXAMPLE"},
		// short base64 secrets after a keyword
		{"base64 secrets", "password: c2VjcmV0MTIz\ntoken=dGVzdA==\n{\"secret\": \"Zm9vYmFy\"} api_key=ZGV2LXBhc3M= SESSION_SECRET=czNjcjN0cHc=",
			"password: <SECRET_1>\ntoken=<SECRET_2>\n{\"secret\": \"<SECRET_3>\"} api_key=<SECRET_4> SESSION_SECRET=<SECRET_5>"},
		{"base64 look-alikes", "token: Password\nLOG_LEVEL: aW5mbw==\nformat=dGV4dA icon=data:image/gif;base64,R0lGODlhAQABAAAAACw= checksum=Q2hlY2tzdW0h",
			"token: Password\nLOG_LEVEL: aW5mbw==\nformat=dGV4dA icon=data:image/gif;base64,R0lGODlhAQABAAAAACw= checksum=Q2hlY2tzdW0h"},
	} {
		if got := s.Text(&Table{}, c.in); got != c.want {
			t.Errorf("%s: Text(%q)\n got %q\nwant %q", c.name, c.in, got, c.want)
		}
	}
}
