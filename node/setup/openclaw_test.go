package setup

import (
	"errors"
	"strings"
	"testing"
	"time"
)

const userConfig = `// My OpenClaw config.
{
  models: {
    providers: {
      // Ollama on this Mac.
      ollama: {
        api: 'openai-completions',
        baseUrl: 'http://127.0.0.1:11434/v1', // the local server
        models: [{ id: "qwen3:8b", name: "Qwen3 8B" }],
      },
      other: { baseUrl: "https://example.com/v1", apiKey: "k" },
    },
  },
  agents: { defaults: { model: { primary: "ollama/qwen3:8b" } } },
}
`

func TestOpenClawConfigPath(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"OPENCLAW_CONFIG_PATH": "/c/x.json", "OPENCLAW_STATE_DIR": "/s"}, "/c/x.json"},
		{map[string]string{"OPENCLAW_CONFIG_PATH": "~/y.json5"}, "/home/u/y.json5"},
		{map[string]string{"OPENCLAW_STATE_DIR": "/s"}, "/s/openclaw.json"},
		{nil, "/home/u/.openclaw/openclaw.json"},
	} {
		if got := OpenClawConfigPath(env(tc.env), "/home/u"); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.env, got, tc.want)
		}
	}
}

func TestDefaultProvider(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		want      Provider
		err       error
	}{
		{"primary", userConfig, Provider{Name: "ollama", Model: "ollama/qwen3:8b", BaseURL: "http://127.0.0.1:11434/v1", API: "openai-completions"}, nil},
		{"string model, default agent wins", `{
			models: {providers: {a: {baseUrl: "http://a/v1", apiKey: "sk-a"}, b: {baseUrl: "http://b", api: "anthropic-messages", apiKey: "${B_KEY}"}}},
			agents: {defaults: {model: "a/m"}, list: [{id: "x", model: "a/m"}, {id: "main", default: true, model: {primary: "b/claude"}}]},
		}`, Provider{Name: "b", Model: "b/claude", BaseURL: "http://b", API: "anthropic-messages"}, nil},
		{"model's api", `{models: {providers: {a: {baseUrl: "http://a/v1", apiKey: "sk-a", models: [{id: "m", api: "openai-responses"}]}}}, agents: {defaults: {model: "a/m"}}}`,
			Provider{Name: "a", Model: "a/m", BaseURL: "http://a/v1", API: "openai-responses", APIKey: "sk-a"}, nil},
		{"no model", `{}`, Provider{}, ErrNoModel},
		{"no provider in ref", `{agents: {defaults: {model: "m"}}}`, Provider{}, ErrNoModel},
		{"built-in provider", `{agents: {defaults: {model: "openai/gpt-5"}}}`, Provider{}, ErrNoProvider},
		{"no baseUrl", `{models: {providers: {a: {api: "openai-completions"}}}, agents: {defaults: {model: "a/m"}}}`, Provider{}, ErrNoProvider},
		{"baseUrl from the environment", `{models: {providers: {a: {baseUrl: "${OLLAMA_URL}/v1"}}}, agents: {defaults: {model: "a/m"}}}`, Provider{}, ErrNoProvider},
		{"api not served", `{models: {providers: {a: {baseUrl: "http://a", api: "google-generative-ai"}}}, agents: {defaults: {model: "a/m"}}}`, Provider{}, ErrAPI},
	} {
		root, err := ParseJSON5([]byte(tc.src))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got, err := DefaultProvider(root)
		if tc.err != nil {
			if !errors.Is(err, tc.err) {
				t.Errorf("%s: err %v, want %v", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: %+v, %v; want %+v", tc.name, got, err, tc.want)
		}
	}
}

// TestPlanApplyUndo routes the user's provider through the gateway and
// back: only the provider's fields change, a second setup changes nothing,
// and the undo gives back the file byte for byte.
func TestPlanApplyUndo(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		route     Route
		upstream  string
		kind      string
		fields    map[string]string
	}{
		{"ollama", userConfig, Route{Gateway: "http://127.0.0.1:8400"}, "http://127.0.0.1:11434/v1", "ollama", map[string]string{"baseUrl": `'http://127.0.0.1:8400/v1'`}},
		{"token and no key", userConfig, Route{Gateway: "http://127.0.0.1:8400", NodeToken: "tok"}, "http://127.0.0.1:11434/v1", "ollama",
			map[string]string{"baseUrl": `'http://127.0.0.1:8400/v1'`, "apiKey": `"tok"`}},
		{"anthropic", `{"models":{"providers":{"cl":{"baseUrl":"http://127.0.0.1:30000","api":"anthropic-messages","apiKey":"sk"}}},"agents":{"defaults":{"model":{"primary":"cl/m"}}}}`,
			Route{Gateway: "http://127.0.0.1:8400", NodeToken: "tok"}, "http://127.0.0.1:30000/v1", "sglang",
			map[string]string{"baseUrl": `"http://127.0.0.1:8400"`, "apiKey": `"tok"`}},
	} {
		root, err := ParseJSON5([]byte(tc.src))
		if err != nil {
			t.Fatal(err)
		}
		plan, err := PlanOpenClaw([]byte(tc.src), root, tc.route)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if plan.Upstream != tc.upstream || plan.UpstreamKind != tc.kind {
			t.Errorf("%s: upstream %q kind %q, want %q %q", tc.name, plan.Upstream, plan.UpstreamKind, tc.upstream, tc.kind)
		}
		out, err := ApplyJSON5([]byte(tc.src), plan.Provider.Name, plan.Changes, false)
		if err != nil {
			t.Fatalf("%s: apply: %v", tc.name, err)
		}
		after, err := ParseJSON5(out)
		if err != nil {
			t.Fatalf("%s: the result is not JSON5: %v\n%s", tc.name, err, out)
		}
		pv := after.Path("models", "providers", plan.Provider.Name)
		for f, want := range tc.fields {
			if v := pv.Field(f); v == nil || string(out[v.Start:v.End]) != want {
				t.Errorf("%s: %s = %v, want %s\n%s", tc.name, f, v, want, out)
			}
		}
		// Nothing but the provider's fields changed.
		if d := Diff("a", "b", tc.src, string(out)); changedLines(d) > len(tc.fields) {
			t.Errorf("%s: more changed than the provider's fields:\n%s", tc.name, d)
		}
		again, err := PlanOpenClaw(out, after, tc.route)
		if err != nil || len(again.Changes) != 0 {
			t.Errorf("%s: second plan %+v, %v: want nothing to change", tc.name, again.Changes, err)
		}
		back, err := ApplyJSON5(out, plan.Provider.Name, plan.Changes, true)
		if err != nil || string(back) != tc.src {
			t.Errorf("%s: undo (%v) gave\n%s\nwant the original\n%s", tc.name, err, back, tc.src)
		}
	}
}

func TestApplyRefusesAChangedProvider(t *testing.T) {
	root, _ := ParseJSON5([]byte(userConfig))
	plan, err := PlanOpenClaw([]byte(userConfig), root, Route{Gateway: "http://127.0.0.1:8400"})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := ApplyJSON5([]byte(userConfig), "ollama", plan.Changes, false)
	moved := strings.Replace(string(out), "127.0.0.1:8400/v1", "10.0.0.9:9999/v1", 1)
	if _, err := ApplyJSON5([]byte(moved), "ollama", plan.Changes, true); !errors.Is(err, ErrChanged) {
		t.Errorf("undo of a provider routed elsewhere since: %v, want ErrChanged", err)
	}
	if _, err := ApplyJSON5([]byte(moved), "ollama", plan.Changes, false); !errors.Is(err, ErrChanged) {
		t.Errorf("setup over a provider changed since the plan: %v, want ErrChanged", err)
	}
}

func TestSetMemberStyles(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{`{}`, `{k: "v"}`},
		{`{ a: 1 }`, `{ k: "v", a: 1 }`},
		{"{\n    \"a\": 1\n}", "{\n    \"k\": \"v\",\n    \"a\": 1\n}"},
		{"{\n\ta: 1, // x\n}", "{\n\tk: \"v\",\n\ta: 1, // x\n}"},
	} {
		root, err := ParseJSON5([]byte(tc.src))
		if err != nil {
			t.Fatal(err)
		}
		got := string(setMember([]byte(tc.src), root, "k", `"v"`))
		if got != tc.want {
			t.Errorf("set in %q: %q, want %q", tc.src, got, tc.want)
		}
		back, _ := ParseJSON5([]byte(got))
		if got := string(removeMember([]byte(got), back, "k")); got != tc.src {
			t.Errorf("remove from %q: %q, want %q", tc.want, got, tc.src)
		}
	}
}

func TestGatewayURL(t *testing.T) {
	for in, want := range map[string]string{"127.0.0.1:8400": "http://127.0.0.1:8400", "0.0.0.0:9000": "http://127.0.0.1:9000", "[::1]:8400": "http://[::1]:8400", ":8400": "http://127.0.0.1:8400"} {
		if got, err := GatewayURL(in); err != nil || got != want {
			t.Errorf("%q: %q %v, want %q", in, got, err, want)
		}
	}
	if _, err := GatewayURL("nonsense"); err == nil {
		t.Error("a listen address with no port was taken")
	}
}

func TestBackupName(t *testing.T) {
	at := time.Date(2026, 11, 25, 9, 8, 7, 0, time.UTC)
	if got := BackupName("/h/.openclaw/openclaw.json", at); got != "/h/.openclaw/openclaw.json.clawmesh-20261125T090807Z.bak" {
		t.Errorf("backup %q", got)
	}
}

func TestSetTOMLKeys(t *testing.T) {
	src := "# my node\nlisten = \"127.0.0.1:8400\"\nupstream = \"http://old/v1\" # old\n\n[share]\nmode = \"none\"\n"
	got := SetTOMLKeys(src, []string{"upstream", "upstream_kind"}, map[string]string{"upstream": "http://127.0.0.1:11434/v1", "upstream_kind": "ollama"})
	want := "# my node\nlisten = \"127.0.0.1:8400\"\nupstream = \"http://127.0.0.1:11434/v1\"\nupstream_kind = \"ollama\"\n\n[share]\nmode = \"none\"\n"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if got := SetTOMLKeys("", []string{"upstream"}, map[string]string{"upstream": `a"b`}); got != "upstream = \"a\\\"b\"\n" {
		t.Errorf("empty file: %q", got)
	}
}

func TestDiff(t *testing.T) {
	a := "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n"
	b := "1\n2\n3\n4\nfive\n6\n7\n8\n9\n10\n"
	want := "--- a\n+++ b\n@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n"
	if got := Diff("a", "b", a, b); got != want {
		t.Errorf("diff\n%s\nwant\n%s", got, want)
	}
	if Diff("a", "b", a, a) != "" {
		t.Error("a diff of equal texts")
	}
}

// changedLines counts a diff's added lines.
func changedLines(d string) int {
	n := 0
	for _, l := range strings.Split(d, "\n") {
		if strings.HasPrefix(l, "+") && !strings.HasPrefix(l, "+++") {
			n++
		}
	}
	return n
}
