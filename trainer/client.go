package trainer

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"

	"github.com/clawmesh/clawmesh/internal/adminapi"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/trainer/group"
)

// Client talks to a running trainer's admin API.
type Client struct {
	// Base is the API's base URL, as http://127.0.0.1:PORT.
	Base  string
	Token string
	HTTP  *http.Client
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body *bytes.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	var resp *http.Response
	var err error
	if body != nil {
		resp, err = adminapi.Do(ctx, c.HTTP, method, c.Base+AdminPrefix+path, c.Token, body)
	} else {
		resp, err = adminapi.Do(ctx, c.HTTP, method, c.Base+AdminPrefix+path, c.Token, nil)
	}
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// Status returns the trainer's view of its group.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var s Status
	err := c.do(ctx, http.MethodGet, "status", nil, &s)
	return s, err
}

// Ledger returns the group's batch ledger.
func (c *Client) Ledger(ctx context.Context) ([]group.Batch, error) {
	var l []group.Batch
	err := c.do(ctx, http.MethodGet, "ledger", nil, &l)
	return l, err
}

// Leave hands the trainer's part over and takes it out of the group; the
// trainer then stops.
func (c *Client) Leave(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "leave", struct{}{}, nil)
}

// Clear lifts the bench of trainer p: it gets shares again.
func (c *Client) Clear(ctx context.Context, p mesh.PeerID) error {
	return c.do(ctx, http.MethodPost, "clear", map[string]mesh.PeerID{"trainer": p}, nil)
}

// Configure changes the group's configuration (the fields set in cfg) and
// returns the new one.
func (c *Client) Configure(ctx context.Context, cfg group.Config) (group.Config, error) {
	var out group.Config
	err := c.do(ctx, http.MethodPost, "config", cfg, &out)
	return out, err
}
