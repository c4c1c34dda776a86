package trainer_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/trainer"
	"github.com/clawmesh/clawmesh/trainer/harness"
)

// metric reads a counter or gauge without labels from t's metrics.
func metric(t *testing.T, tr *trainer.Trainer, name string) float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	tr.Metrics().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	f := fams[name]
	if f == nil || len(f.Metric) != 1 {
		t.Fatalf("no series %s", name)
	}
	if c := f.Metric[0].Counter; c != nil {
		return c.GetValue()
	}
	return f.Metric[0].Gauge.GetValue()
}

// rpcFrame is a request line of the trainers' protocol: its JSON's
// length (4 bytes, big-endian), then the JSON.
func rpcFrame(v any) []byte {
	b, _ := json.Marshal(v)
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...)
}

// TestRPCBounds: over real hosts, a trainer that declares a payload of
// 200 MiB and sends 1 KiB costs the other the bytes that came, not the
// size declared; and a trainer that opens more streams at once than its
// share waits, then has the extra ones reset.
func TestRPCBounds(t *testing.T) {
	ctx := context.Background()
	c, err := harness.NewCluster(ctx, harness.ClusterOptions{Trainers: 2, Timing: trainer.QuickTiming, Group: trainer.QuickGroup, Dir: t.TempDir(), Logger: trainer.NewTestLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, b := c.Trainer(0), c.Trainer(1)
	if b.Peer() == nil {
		t.Skip("the cluster's trainers run no peer of their own")
	}
	if err := c.WaitUntil(ctx, time.Minute, "the trainers to admit each other", func() bool {
		return a.Peer().Mesh.Admitted(b.ID()) && b.Peer().Mesh.Admitted(a.ID())
	}); err != nil {
		t.Fatal(err)
	}
	open := func() mesh.Stream {
		t.Helper()
		octx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		s, err := b.Peer().Host.NewStream(octx, a.ID(), trainer.Protocol)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	// A payload of 200 MiB declared, 1 KiB sent.
	before := metric(t, a, "clawmesh_trainer_rpc_allocated_bytes_total")
	s := open()
	s.Write(rpcFrame(map[string]any{"op": "hold", "hash": "00", "size": 200 << 20}))
	s.Write(make([]byte, 1<<10))
	s.CloseWrite()
	s.SetReadDeadline(time.Now().Add(20 * time.Second))
	io.Copy(io.Discard, s) // the trainer resets the stream at the early end
	s.Close()
	if got := metric(t, a, "clawmesh_trainer_rpc_allocated_bytes_total") - before; got > 16<<20 {
		t.Errorf("a payload declared of 200 MiB, 1 KiB sent: the trainer allocated %.0f bytes", got)
	}

	// Streams that stall in their payload hold the caller's turns; one
	// more is reset.
	for range 4 {
		s := open()
		defer s.Reset()
		s.Write(rpcFrame(map[string]any{"op": "hold", "hash": "00", "size": 1 << 20}))
	}
	refused := metric(t, a, "clawmesh_trainer_rpc_streams_refused_total")
	extra := open()
	defer extra.Close()
	extra.Write(rpcFrame(map[string]any{"op": "hold", "hash": "00", "size": 1}))
	extra.SetReadDeadline(time.Now().Add(30 * time.Second))
	io.Copy(io.Discard, extra)
	if err := c.WaitUntil(ctx, 30*time.Second, "the extra stream refused", func() bool {
		return metric(t, a, "clawmesh_trainer_rpc_streams_refused_total") > refused
	}); err != nil {
		t.Fatal(err)
	}
}
