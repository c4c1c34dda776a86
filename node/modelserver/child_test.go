package modelserver_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// childEnv makes the test binary a small model server: the child the
// supervisor runs in these tests.
const childEnv = "CLAWMESH_MODELSERVER_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(child(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// child serves llama-server's flags and endpoints, as far as the tests
// need (and mlx_lm.server's --model and "adapters"): -m, --lora, --host,
// --port; GET /health, GET /v1/models, POST /v1/chat/completions whose
// reply names the process, its adapter and the call's, and, when
// streamed, comes in CHILD_CHUNKS chunks CHILD_CHUNK_DELAY apart. With
// CHILD_FAIL=1 it exits at once.
func child(args []string) int {
	fs := flag.NewFlagSet("child", flag.ContinueOnError)
	model := fs.String("m", "", "")
	fs.StringVar(model, "model", "", "") // mlx_lm.server's
	lora := fs.String("lora", "", "")
	host := fs.String("host", "127.0.0.1", "")
	port := fs.Int("port", 0, "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	fmt.Printf("child: model %s lora %q port %d\n", *model, *lora, *port)
	if os.Getenv("CHILD_FAIL") == "1" {
		fmt.Fprintln(os.Stderr, "child: failing at start, as asked")
		return 3
	}
	chunks, _ := strconv.Atoi(os.Getenv("CHILD_CHUNKS"))
	delay, _ := time.ParseDuration(os.Getenv("CHILD_CHUNK_DELAY"))
	ln, err := net.Listen("tcp", net.JoinHostPort(*host, strconv.Itoa(*port)))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"status":"ok"}`))
	})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": []map[string]any{{"id": *model, "object": "model"}}})
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		var q struct {
			Stream   bool   `json:"stream"`
			Model    string `json:"model"`
			Adapters string `json:"adapters"` // mlx_lm.server's
		}
		json.NewDecoder(r.Body).Decode(&q)
		who := "pid " + strconv.Itoa(os.Getpid()) + " lora " + *lora + " adapters " + q.Adapters
		if q.Model == "" {
			q.Model = *model
		}
		w.Header().Set("X-Child-Lora", *lora)
		if !q.Stream {
			json.NewEncoder(w).Encode(map[string]any{"object": "chat.completion", "model": q.Model,
				"choices": []map[string]any{{"index": 0, "finish_reason": "stop", "message": map[string]string{"role": "assistant", "content": who}}}})
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range max(chunks, 1) {
			b, _ := json.Marshal(map[string]any{"object": "chat.completion.chunk", "model": q.Model,
				"choices": []map[string]any{{"index": 0, "delta": map[string]string{"content": fmt.Sprintf("%s #%d;", who, i)}}}})
			fmt.Fprintf(w, "data: %s\n\n", b)
			w.(http.Flusher).Flush()
			time.Sleep(delay)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	srv := &http.Server{Handler: mux}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	go func() {
		<-sig
		fmt.Println("child: stopping")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}()
	fmt.Println("child: listening on", ln.Addr())
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		return 1
	}
	return 0
}
