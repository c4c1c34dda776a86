package node

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/clawmesh/clawmesh/node/setup"
)

// discoverTimeout bounds each probe of a local model server.
const discoverTimeout = 2 * time.Second

// Found is a model server that answered on this device.
type Found struct {
	setup.LocalServer
	// URL is its base URL, including /v1; Models the ids it lists.
	URL    string
	Models []string
}

// Discover asks each of the servers on loopback for its models (GET
// http://127.0.0.1:PORT/v1/models), all at once, and returns those that
// answer with an OpenAI model list, in the order given.
func Discover(ctx context.Context, servers []setup.LocalServer) []Found {
	found := make([]*Found, len(servers))
	var wg sync.WaitGroup
	for i, s := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			base := "http://" + net.JoinHostPort("127.0.0.1", s.Port) + "/v1"
			if models, ok := listModels(ctx, base); ok {
				found[i] = &Found{LocalServer: s, URL: base, Models: models}
			}
		}()
	}
	wg.Wait()
	var out []Found
	for _, f := range found {
		if f != nil {
			out = append(out, *f)
		}
	}
	return out
}

func listModels(ctx context.Context, base string) ([]string, bool) {
	ctx, cancel := context.WithTimeout(ctx, discoverTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/models", nil)
	if err != nil {
		return nil, false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, false
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list); err != nil || list.Data == nil {
		return nil, false
	}
	ids := make([]string, 0, len(list.Data))
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	return ids, true
}
