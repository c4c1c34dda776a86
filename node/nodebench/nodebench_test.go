package nodebench

import (
	"context"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestOptionsValidate(t *testing.T) {
	ok := SoakOptions{Binary: "clawmesh", Rate: 10, Duration: time.Second, Every: time.Second}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []func(*SoakOptions){
		func(o *SoakOptions) { o.Binary = "" },
		func(o *SoakOptions) { o.Rate = 0 },
		func(o *SoakOptions) { o.Duration = 0 },
		func(o *SoakOptions) { o.Every = 0 },
		func(o *SoakOptions) { o.Idle = -time.Second },
		func(o *SoakOptions) { o.MaxSessions = -1 },
	} {
		o := ok
		bad(&o)
		if err := o.Validate(); err == nil {
			t.Errorf("%+v accepted", o)
		}
		if _, err := Soak(context.Background(), o); err == nil {
			t.Errorf("Soak ran %+v", o)
		}
	}
	closed := ok
	closed.Rate, closed.Clients = 0, 6
	if err := closed.Validate(); err != nil {
		t.Errorf("closed loop without a rate refused: %v", err)
	}
	closed.Clients = -1
	if err := closed.Validate(); err == nil {
		t.Error("negative clients accepted")
	}
	if _, err := Footprint(context.Background(), FootprintOptions{Calls: 1}); err == nil {
		t.Error("Footprint ran without a binary")
	}
	if _, err := Footprint(context.Background(), FootprintOptions{Binary: "clawmesh", Calls: -1}); err == nil {
		t.Error("Footprint ran with negative calls")
	}
	if _, err := Idle(context.Background(), IdleOptions{Duration: time.Second}); err == nil {
		t.Error("Idle ran without a binary")
	}
}

// TestProc reads this process's CPU time and resident memory.
func TestProc(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	pid := os.Getpid()
	if _, err := cpuTicks(pid); err != nil {
		t.Fatal(err)
	}
	n, err := rss(pid)
	if err != nil || n <= 0 {
		t.Fatalf("rss %d, %v", n, err)
	}
}

func TestIdlePrint(t *testing.T) {
	for _, tc := range []struct {
		r    IdleResult
		want string
	}{
		{IdleResult{Alone: Cost{CPU: 0.1, RSS: 50 << 20}, Peer: Cost{CPU: 0.6, RSS: 80 << 20}}, "the mesh adds 0.50% of a core and 30.0 MiB; goal < 1% and < 100 MiB: met"},
		{IdleResult{Alone: Cost{CPU: 0.1, RSS: 50 << 20}, Peer: Cost{CPU: 1.2, RSS: 80 << 20}}, "NOT MET"},
		{IdleResult{Alone: Cost{RSS: 50 << 20}, Peer: Cost{RSS: 150 << 20}}, "NOT MET"},
	} {
		var b strings.Builder
		tc.r.Print(&b)
		if !strings.Contains(b.String(), tc.want) || strings.Count(b.String(), "\n") != 3 {
			t.Errorf("%+v:\n%s", tc.r, b.String())
		}
	}
}

// TestLoadFigures: the RSS at 120 s and the least-squares slope of the last
// minute of the load, in bytes a minute.
func TestLoadFigures(t *testing.T) {
	var samples []SoakSample
	for at := 1.0; at <= 180; at++ {
		rss := int64(200 << 20)
		if at > 120 {
			rss += int64((at - 120) / 60 * (12 << 20)) // +12 MiB a minute
		}
		samples = append(samples, SoakSample{At: at, RSS: rss})
	}
	at120, slope := loadFigures(samples, 180)
	if at120 != 200<<20 {
		t.Errorf("at 120 s: %d", at120)
	}
	if slope < 11.9*(1<<20) || slope > 12.1*(1<<20) {
		t.Errorf("slope %.0f bytes a minute, want 12 MiB", slope)
	}
	at120, slope = loadFigures(samples[:60], 60)
	if at120 != 0 || slope != 0 {
		t.Errorf("a flat 60 s load: at 120 s %d, slope %.0f", at120, slope)
	}
}
