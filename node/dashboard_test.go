package node_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/clawmesh/clawmesh/internal/adminapi"
	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/fakeupstream"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/peer"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/share"
	"github.com/clawmesh/clawmesh/pool"
)

// livedNode runs a node that has recorded a short conversation (a wrong
// answer the user corrects, a tool call that fails, a fix), scored the
// closed steps with the built-in plugins and sealed them into a batch.
func livedNode(t *testing.T, cfg node.Config) (*node.Node, string) {
	t.Helper()
	cfg.ScoreInterval = time.Hour
	cfg.ShareInterval = time.Hour
	cfg.Share = share.Policy{Mode: share.ModeAll}
	n, base := startNode(t, fakeupstream.Script{Turns: []fakeupstream.Turn{
		{Text: "The capital of Australia is Sydney."},
		{ToolCalls: []fakeupstream.ToolCall{{ID: "call_1", Name: "exec", Arguments: `{"command":"make"}`}}},
		{Text: "Fixed."},
	}}, cfg)
	before := n.Scorer().Scored
	chat := base + "/v1/chat/completions"
	sys := `{"role":"system","content":"You are helpful."}`
	u1 := `{"role":"user","content":"What is the capital of Australia?"}`
	a1 := `{"role":"assistant","content":"The capital of Australia is Sydney."}`
	u2 := `{"role":"user","content":"No, that's wrong. You should have checked: it is Canberra. Now build the project."}`
	tc := `{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"exec","arguments":"{\"command\":\"make\"}"}}]}`
	tr := `{"role":"tool","tool_call_id":"call_1","content":"make: *** [all] Error 2\nerror: undefined reference to main (exit status 2)"}`
	auth := []string{}
	if cfg.Token != "" {
		auth = []string{"Authorization", "Bearer " + cfg.Token}
	}
	post(t, chat, `{"model":"m","messages":[`+sys+`,`+u1+`]}`, auth...)
	post(t, chat, `{"model":"m","messages":[`+sys+`,`+u1+`,`+a1+`,`+u2+`]}`, auth...)
	post(t, chat, `{"model":"m","messages":[`+sys+`,`+u1+`,`+a1+`,`+u2+`,`+tc+`,`+tr+`]}`, auth...)
	ctx := context.Background()
	if k := scoreAll(t, n, before); k != 2 {
		t.Fatalf("scored %d steps, want 2", k)
	}
	if k, err := n.Outbox().SealAll(ctx); err != nil || k != 1 {
		t.Fatalf("sealed %d batches (%v), want 1", k, err)
	}
	return n, base
}

// scrape reads url's Prometheus text with the Prometheus text parser.
func scrape(t *testing.T, url, token string) map[string]*dto.MetricFamily {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("GET %s: content type %q", url, ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: not Prometheus text: %v", url, err)
	}
	return fams
}

// value is the value of the one series of fams[name] whose labels include
// labels (name=value pairs).
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("no series %s", name)
	}
next:
	for _, m := range f.Metric {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, l := range m.Label {
				if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return 0
}

// TestMetricsScrape scrapes a real node's /metrics after it recorded,
// scored and sealed, and checks the named series against what happened.
func TestMetricsScrape(t *testing.T) {
	n, base := livedNode(t, node.Config{})
	fams := scrape(t, base+"/metrics", "")
	steps, err := n.Pool().List(context.Background(), pool.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	withValue := 0
	for _, s := range steps {
		if s.Reward != nil && s.Reward.Value != nil {
			withValue++
		}
	}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"clawmesh_steps_recorded_total", nil, 3},
		{"clawmesh_gateway_call_seconds", []string{"api", string(core.APIChat)}, 3},
		{"clawmesh_gateway_record_failures_total", nil, 0},
		{"clawmesh_gateway_upstream_failures_total", nil, 0},
		{"clawmesh_steps_scored_total", nil, 2},
		{"clawmesh_step_reward", nil, float64(withValue)},
		{"clawmesh_outbox_batches", nil, 1},
		{"clawmesh_outbox_batches_unshipped", nil, 1},
		{"clawmesh_batches_shipped_total", nil, 0},
		{"clawmesh_gossip_batch_pulls_total", nil, 0},
		{"clawmesh_mesh_peers_connected", nil, 0},
		{"clawmesh_adapter_serving_version", nil, 0},
		{"clawmesh_adapter_staleness_versions", nil, 0},
		{"clawmesh_weights_fetched_bytes_total", nil, 0},
		{"clawmesh_weights_versions_refused_total", []string{"reason", "stale"}, 0},
	} {
		if got := value(t, fams, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if withValue == 0 {
		t.Error("no step got a reward: the reward histogram was not exercised")
	}
	// One plugin-failure series per plugin, at 0: the built-ins did not
	// fail.
	pf := fams["clawmesh_plugin_failures_total"]
	if pf == nil || len(pf.Metric) < 3 {
		t.Fatalf("plugin failures: %v", pf)
	}
	for _, m := range pf.Metric {
		if m.Counter.GetValue() != 0 {
			t.Errorf("plugin failures %v = %v", m.Label, m.Counter.GetValue())
		}
	}
	if _, ok := fams["go_goroutines"]; !ok {
		t.Error("no Go runtime series")
	}
}

// TestMetricsTakeTheToken checks that a gateway with a token asks it of
// /metrics as of the API, and that the admin API's pages are not opened by
// it.
func TestMetricsTakeTheToken(t *testing.T) {
	_, base := livedNode(t, node.Config{Token: "s3cret"})
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("/metrics without the token: %s", resp.Status)
	}
	if got := value(t, scrape(t, base+"/metrics", "s3cret"), "clawmesh_steps_recorded_total"); got != 3 {
		t.Fatalf("recorded %v", got)
	}
	req, _ := http.NewRequest(http.MethodGet, base+"/clawmesh/", nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the dashboard with the gateway's token: %s", resp.Status)
	}
}

// chromium finds Debian's chromium (or another Chrome) on PATH.
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no chromium on PATH (apt-get install -y chromium): the dashboard's browser test needs one")
	return ""
}

// TestDashboardInChromium opens a lived node's dashboard in a real
// browser, logged in with a login URL as the owner would be: the page
// loads with no console error, the rewards chart draws a dot per rewarded
// step and its mean line, the figures match the admin API, and the preview
// link opens the next batch scrubbed. A screenshot is kept in
// $CLAWMESH_ARTIFACTS (or the test's temporary directory).
func TestDashboardInChromium(t *testing.T) {
	exe := chromium(t)
	t.Run("alone", func(t *testing.T) { dashboardInChromium(t, exe, false) })
	t.Run("in a mesh", func(t *testing.T) { dashboardInChromium(t, exe, true) })
}

func dashboardInChromium(t *testing.T, exe string, inMesh bool) {
	cfg := node.Config{}
	if inMesh {
		// The node's data directory founds a mesh of its own: it runs a
		// peer, a weights service and a follower.
		cfg.DataDir = t.TempDir()
		key, id, err := peer.Identity(cfg.DataDir)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := mesh.Init(cfg.DataDir, "home", key, id, time.Now(), rand.Reader); err != nil {
			t.Fatal(err)
		}
		cfg.Mesh = &node.MeshConfig{Listen: []string{"/ip4/127.0.0.1/udp/0/quic-v1", "/ip4/127.0.0.1/tcp/0"}, Weights: "127.0.0.1:0"}
	}
	n, base := livedNode(t, cfg)
	ctx := context.Background()
	cl := &node.Client{Base: base, Token: n.AdminToken()}
	stats, err := cl.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	steps, err := cl.List(ctx, pool.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	rewarded := 0
	for _, s := range steps {
		if s.Reward != nil && s.Reward.Value != nil {
			rewarded++
		}
	}
	login, err := cl.LoginURL(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// Without a session the page is refused.
	resp, err := http.Get(base + "/clawmesh/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("dashboard without a session: %s", resp.Status)
	}
	// A browser without a session gets a page that says how to log in.
	req, _ := http.NewRequest("GET", base+"/clawmesh/", nil)
	req.Header.Set("Accept", "text/html")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") || !strings.Contains(string(body), "clawmesh login") {
		t.Fatalf("a browser without a session: %s %s\n%s", resp.Status, resp.Header.Get("Content-Type"), body)
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox,
		chromedp.Flag("headless", true), chromedp.WindowSize(1100, 1600))
	actx, cancel := chromedp.NewExecAllocator(ctx, opts...)
	defer cancel()
	bctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	bctx, cancel = context.WithTimeout(bctx, 2*time.Minute)
	defer cancel()
	var (
		mu          sync.Mutex
		consoleErrs []string
	)
	err = chromedp.Listen(bctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch e := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.ConsoleAPICalledTypeError {
				consoleErrs = append(consoleErrs, fmt.Sprintf("console.error %v", e.Args))
			}
		case *runtime.EventExceptionThrown:
			consoleErrs = append(consoleErrs, "exception "+e.ExceptionDetails.Text)
		case *log.EventEntryAdded:
			if e.Entry.Level == log.EntryLevelError {
				consoleErrs = append(consoleErrs, e.Entry.Text+" "+e.Entry.URL)
			}
		}
	})
	if err != nil {
		t.Fatalf("starting %s: %v", exe, err)
	}
	// The login URL takes the browser to the dashboard.
	if err := chromedp.Do(bctx, chromedp.Navigate(login.URL), chromedp.WaitVisible(chromedp.ID("rewards-chart"))); err != nil {
		t.Fatalf("browser: login URL: %v", err)
	}
	// The session holds by the other loopback name too.
	if err := chromedp.Do(bctx, chromedp.Navigate(strings.Replace(base, "127.0.0.1", "localhost", 1)+"/clawmesh/"), chromedp.WaitVisible(chromedp.ID("rewards-chart"))); err != nil {
		t.Fatalf("browser: dashboard on localhost: %v", err)
	}
	text := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("browser: %s: %v", sel, err)
		}
		return strings.TrimSpace(v)
	}
	eval := func(js string) float64 {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[float64](js))
		if err != nil {
			t.Fatalf("browser: %s: %v", js, err)
		}
		return v
	}
	total, scoredState, batches := text("#steps-total"), text(`#states td[data-state="scored"]`), text("#batches-total")
	dots := eval(`document.querySelectorAll("#rewards-chart circle").length`)
	dotWidth := eval(`document.querySelector("#rewards-chart circle").getBBox().width`)
	lineLen := eval(`(function(){ const l = document.querySelector("#rewards-chart polyline.mean"); return l ? l.getBBox().width : 0 })()`)
	href, err := chromedp.Run(bctx, chromedp.AttributeValue(chromedp.ID("preview-link"), "href"))
	if err != nil {
		t.Fatal(err)
	}
	previewHref := href.Value
	if strings.HasPrefix(previewHref, "/") {
		previewHref = base + previewHref
	}
	shot, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("CLAWMESH_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	name := "dashboard.png"
	if inMesh {
		name = "dashboard-mesh.png"
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
	mu.Lock()
	if len(consoleErrs) > 0 {
		t.Errorf("console errors: %q", consoleErrs)
	}
	mu.Unlock()
	if total != strconv.Itoa(stats.Steps) {
		t.Errorf("page says %q steps, the admin API %d", total, stats.Steps)
	}
	if scoredState != strconv.Itoa(stats.ByState[core.StateScored]) {
		t.Errorf("page says %q scored, the admin API %d", scoredState, stats.ByState[core.StateScored])
	}
	if batches != strconv.Itoa(stats.Batches) {
		t.Errorf("page says %q batches, the admin API %d", batches, stats.Batches)
	}
	if int(dots) != rewarded || rewarded == 0 {
		t.Errorf("the chart has %v dots, %d steps have a reward", dots, rewarded)
	}
	if dotWidth <= 0 {
		t.Errorf("the chart's dots are not drawn (width %v)", dotWidth)
	}
	if lineLen <= 0 {
		t.Errorf("the chart's mean line is not drawn")
	}

	if inMesh {
		ws, err := cl.Weights(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := text("#serving"); got != ws.Serving {
			t.Errorf("page says %q serves, the admin API %q", got, ws.Serving)
		}
		var st peer.Status
		var peers []peer.PeerInfo
		for path, v := range map[string]any{"status": &st, "peers": &peers} {
			resp, err := adminapi.Do(ctx, nil, http.MethodGet, base+peer.AdminPrefix+path, n.AdminToken(), nil)
			if err != nil {
				t.Fatal(err)
			}
			err = json.NewDecoder(resp.Body).Decode(v)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
		}
		if got := text("#peers-admitted"); got != strconv.Itoa(len(peers)) {
			t.Errorf("page says %q peers admitted, the admin API %d", got, len(peers))
		}
		if got := text("#peers-connected"); got != strconv.Itoa(st.Connected) {
			t.Errorf("page says %q peers connected, the admin API %d", got, st.Connected)
		}
	}

	// The preview link opens the next batch as the admin API gives it,
	// through the browser's session.
	if err := chromedp.Do(bctx, chromedp.Navigate(previewHref)); err != nil {
		t.Fatal(err)
	}
	previewBody := text("body")
	if !strings.Contains(previewBody, `"header"`) || !strings.Contains(previewBody, `"sealed"`) {
		t.Errorf("preview link gave %.300q", previewBody)
	}
}
