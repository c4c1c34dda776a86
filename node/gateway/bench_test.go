package gateway

import (
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/fakeupstream"
)

// benchCall measures one POST against base, reading the whole reply.
func benchCall(b *testing.B, c *http.Client, url, body string) time.Duration {
	start := time.Now()
	resp, err := c.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		b.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		b.Fatalf("status %d", resp.StatusCode)
	}
	return time.Since(start)
}

func pct(d []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[int(p*float64(len(s)-1))]
}

// benchGateway alternates direct and through-the-gateway calls and reports
// the added latency (p50, p99 of through minus direct p50).
func benchGateway(b *testing.B, body string) {
	e := newEnv(b, fakeupstream.Script{Chunks: 16, Turns: []fakeupstream.Turn{{Text: strings.Repeat("token ", 64)}}}, nil)
	c := &http.Client{Transport: DefaultTransport()}
	// Warm the connections.
	benchCall(b, c, e.url+"/v1/chat/completions", body)
	benchCall(b, c, e.directURL+"/v1/chat/completions", body)
	var direct, through []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		direct = append(direct, benchCall(b, c, e.directURL+"/v1/chat/completions", body))
		through = append(through, benchCall(b, c, e.url+"/v1/chat/completions", body))
	}
	b.StopTimer()
	d50 := pct(direct, 0.5)
	b.ReportMetric(float64(d50.Microseconds()), "direct-p50-µs")
	b.ReportMetric(float64(pct(through, 0.5).Microseconds()), "gateway-p50-µs")
	b.ReportMetric(float64((pct(through, 0.5) - d50).Microseconds()), "added-p50-µs")
	b.ReportMetric(float64((pct(through, 0.99) - pct(direct, 0.99)).Microseconds()), "added-p99-µs")
}

func BenchmarkGatewayChat(b *testing.B) {
	benchGateway(b, `{"model":"m","messages":[{"role":"system","content":"`+strings.Repeat("You are helpful. ", 200)+`"},{"role":"user","content":"hello"}]}`)
}

func BenchmarkGatewayStream(b *testing.B) {
	benchGateway(b, `{"model":"m","stream":true,"messages":[{"role":"system","content":"`+strings.Repeat("You are helpful. ", 200)+`"},{"role":"user","content":"hello"}]}`)
}
