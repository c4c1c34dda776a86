package nodebench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The goals of an idle node (`clawmesh bench idle`): its resident memory,
// and the size of a fresh node's data directory (the plugins' compilation
// cache lives in the user's cache directory, not there).
const (
	GoalIdleRSS  = 100 << 20
	GoalDataSize = 20 << 20
)

// FootprintOptions configures Footprint.
type FootprintOptions struct {
	// Binary is the clawmesh binary run as the node (required).
	Binary string
	// Calls are sent (each its own conversation, ended with
	// X-Session-Done so that it is scored) once the plugins are ready.
	Calls int
	// Wait is how long the node is left idle, once the calls are scored,
	// before it is measured.
	Wait time.Duration
}

// Validate reports options Footprint cannot run.
func (o FootprintOptions) Validate() error {
	if o.Binary == "" {
		return errors.New("nodebench: no binary to run as the node")
	}
	if o.Calls < 0 || o.Wait < 0 {
		return errors.New("nodebench: the calls and the wait must not be negative")
	}
	return nil
}

// FootprintResult is what `clawmesh bench idle --json` prints.
type FootprintResult struct {
	Calls int `json:"calls"`
	// ScoredInS is how long after the last call the node had scored them
	// all (the built-in plugins ran); WaitS how long it was left idle
	// from then on before it was measured.
	ScoredInS float64 `json:"scored_in_s"`
	WaitS     float64 `json:"wait_s"`
	// Scored is how many steps the node's scorer had scored when it was
	// measured.
	Scored uint64 `json:"scored"`
	// RSS is the node's resident memory: RSSAnon its anonymous part (Go
	// heap, stacks, Pebble, the plugins' compiled code), RSSFile the part
	// mapped from files (mostly the binary itself).
	RSS     int64 `json:"rss_bytes"`
	RSSAnon int64 `json:"rss_anon_bytes"`
	RSSFile int64 `json:"rss_file_bytes"`
	GoalRSS int64 `json:"goal_rss_bytes"`
	// DataBytes is the size of the node's data directory (a fresh one);
	// CacheBytes that of the plugins' compilation cache, in the user's
	// cache directory (a fresh one too, so the first start compiles).
	DataBytes  int64  `json:"data_bytes"`
	GoalData   int64  `json:"goal_data_bytes"`
	CacheBytes int64  `json:"cache_bytes"`
	CacheDir   string `json:"cache_dir"`
	// Met says whether the RSS and the data directory meet their goals.
	Met bool `json:"met"`
}

// Footprint runs o.Binary as a node on a fresh data directory, with the
// built-in plugins and a fresh user cache directory, in front of a scripted
// upstream; sends it o.Calls calls once its plugins are ready, waits until
// they are scored and then o.Wait, and measures its resident memory (from /proc, Linux only) and the
// size of its data and cache directories.
func Footprint(ctx context.Context, o FootprintOptions) (*FootprintResult, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "clawmesh-bench-idle-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	upstream, err := scriptedUpstream(ctx)
	if err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	userCache := filepath.Join(dir, "user-cache")
	// XDG_CACHE_HOME is os.UserCacheDir on Linux; the node's compilation
	// cache goes under it.
	n, err := startNode(ctx, o.Binary, data, []string{"node", "--data", data, "--listen", "127.0.0.1:0", "--log", "warn",
		"--upstream", upstream, "--min-free", "0"}, []string{"XDG_CACHE_HOME=" + userCache}, nil)
	if err != nil {
		return nil, err
	}
	defer stop(n.cmd)
	addr, admin := n.addr, n.admin

	client := &http.Client{Timeout: 30 * time.Second}
	for k := range o.Calls {
		body := fmt.Sprintf(`{"model":"idle","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"call %d: say something"}]}`, k)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Session-Done", "true")
		resp, err := client.Do(req)
		if err != nil {
			return nil, fmt.Errorf("call %d: %w", k, err)
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		if err != nil {
			return nil, fmt.Errorf("call %d: %w", k, err)
		}
	}
	// The calls are scored within seconds (every call ended its
	// conversation): the plugins ran. The wait starts then.
	callsDone := time.Now()
	for i := 0; ; i++ {
		sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
		sc, err := admin.Scorer(sctx)
		scancel()
		if err == nil && sc.Scored >= uint64(o.Calls) {
			break
		}
		if i == 1200 { // 2 min
			return nil, fmt.Errorf("the node scored %d of %d calls in 2 minutes (%v)", sc.Scored, o.Calls, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	scoredIn := time.Since(callsDone)
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(o.Wait):
	}

	r := &FootprintResult{Calls: o.Calls, WaitS: o.Wait.Seconds(), ScoredInS: scoredIn.Seconds(), GoalRSS: GoalIdleRSS, GoalData: GoalDataSize,
		CacheDir: filepath.Join(userCache, "clawmesh", "wazero")}
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	sc, err := admin.Scorer(sctx)
	scancel()
	if err != nil {
		return nil, fmt.Errorf("the node's scorer: %w", err)
	}
	r.Scored = sc.Scored
	st, err := procStatus(n.cmd.Process.Pid, "VmRSS", "RssAnon", "RssFile")
	if err != nil {
		return nil, fmt.Errorf("reading /proc (Linux only): %w", err)
	}
	r.RSS, r.RSSAnon, r.RSSFile = st[0], st[1], st[2]
	if r.DataBytes, err = dirSize(data); err != nil {
		return nil, err
	}
	if r.CacheBytes, err = dirSize(userCache); err != nil {
		return nil, err
	}
	r.Met = r.RSS <= r.GoalRSS && r.DataBytes <= r.GoalData
	return r, nil
}

// Print writes the figures beside their goals.
func (r *FootprintResult) Print(w io.Writer) {
	mib := func(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT MET"
	}
	fmt.Fprintf(w, "node with the built-in plugins, %d calls scored (%.1fs after the last), then %.0fs idle\n", r.Calls, r.ScoredInS, r.WaitS)
	fmt.Fprintf(w, "  RSS               %10s (anon %s, file %s)   goal <= %s: %s\n", mib(r.RSS), mib(r.RSSAnon), mib(r.RSSFile), mib(r.GoalRSS), verdict(r.RSS <= r.GoalRSS))
	fmt.Fprintf(w, "  data directory    %10s   goal <= %s: %s\n", mib(r.DataBytes), mib(r.GoalData), verdict(r.DataBytes <= r.GoalData))
	fmt.Fprintf(w, "  compile cache     %10s   (user cache directory, shared by the nodes of the machine)\n", mib(r.CacheBytes))
}

// procStatus reads fields of /proc/PID/status given in kB, in bytes.
func procStatus(pid int, fields ...string) ([]int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	out := make([]int64, len(fields))
	found := 0
	for _, line := range strings.Split(string(b), "\n") {
		name, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		for i, f := range fields {
			if name != f {
				continue
			}
			kv := strings.Fields(v)
			if len(kv) < 1 {
				return nil, fmt.Errorf("/proc/%d/status: %s: %q", pid, f, v)
			}
			kb, err := strconv.ParseInt(kv[0], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("/proc/%d/status: %s: %w", pid, f, err)
			}
			out[i] = kb << 10
			found++
		}
	}
	if found != len(fields) {
		return nil, fmt.Errorf("/proc/%d/status: want %s", pid, strings.Join(fields, ", "))
	}
	return out, nil
}

// dirSize is the size of the files under dir (their length, which is never
// less than the space a preallocated file takes until it is written), 0 if
// dir does not exist.
func dirSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return nil // removed meanwhile
			}
			n += info.Size()
		}
		return nil
	})
	return n, err
}
