package swap

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/clawmesh/clawmesh/model/serveapi"
)

// clawmeshDriver drives `clawmesh serve` (package model/serve), which
// holds one adapter version at a time and swaps it atomically itself:
// requests in flight finish on the version they started with, new ones get
// the new one. Its Targets keep the client's model (Model "").
//
// It speaks the server's contract, package model/serveapi: the adapter
// endpoint (serveapi.AdapterPath) and the header every reply names its
// version in (serveapi.AdapterHeader).
type clawmeshDriver struct{ *client }

// Load implements Driver.
func (d *clawmeshDriver) Load(ctx context.Context, version, dir string) (Target, error) {
	if err := checkVersion(version); err != nil {
		return Target{}, err
	}
	abs, _, err := readAdapter(dir)
	if err != nil {
		return Target{}, err
	}
	r, err := d.do(ctx, http.MethodPost, d.root+serveapi.AdapterPath, serveapi.AdapterRequest{Path: abs, Version: version}, 0)
	if err != nil {
		return Target{}, err
	}
	switch {
	case r.status == http.StatusOK:
	case r.status == http.StatusNotFound || r.status == http.StatusMethodNotAllowed:
		return Target{}, fmt.Errorf("%w: %s has no /clawmesh/v1/adapter (%d %s): is it `clawmesh serve`? If not, set the node's upstream kind to the server it is", ErrUnsupported, d.root, r.status, r.message())
	case r.status == http.StatusBadRequest:
		return Target{}, fmt.Errorf("%w: version %s from %s: %s", ErrRefused, version, abs, r.message())
	default:
		return Target{}, d.failure("loading version "+version, r)
	}
	if got := r.header.Get(serveapi.AdapterHeader); got != version {
		return Target{}, fmt.Errorf("%w: loaded version %s, but the server says it serves %q", ErrUpstream, version, got)
	}
	t := Target{Version: version}
	d.log.Info("adapter loaded", "target", t, "dir", abs)
	return t, nil
}

// Base implements Driver. `clawmesh serve` can load an adapter but not drop
// one: the base model is servable while no adapter was ever loaded (the
// server's version is then "base"), and after that only by a restart.
func (d *clawmeshDriver) Base(ctx context.Context) (Target, error) {
	r, err := d.do(ctx, http.MethodGet, d.root+serveapi.AdapterPath, nil, 0)
	if err != nil {
		return Target{}, err
	}
	if r.status == http.StatusNotFound {
		return Target{}, fmt.Errorf("%w: %s has no /clawmesh/v1/adapter: is it `clawmesh serve`? If not, set the node's upstream kind to the server it is", ErrUnsupported, d.root)
	}
	if r.status != http.StatusOK {
		return Target{}, d.failure("asking for the served version", r)
	}
	var v serveapi.AdapterReply
	if err := json.Unmarshal(r.body, &v); err != nil || v.Version == "" {
		return Target{}, fmt.Errorf("%w: GET /clawmesh/v1/adapter: no version in %q", ErrUpstream, r.body)
	}
	if v.Version != BaseVersion {
		return Target{}, fmt.Errorf("%w: `clawmesh serve` holds version %s and cannot drop an adapter while it runs; restart it without --adapter to serve the base model", ErrUnsupported, v.Version)
	}
	return Target{Version: BaseVersion}, nil
}

// Warm implements Driver: a one-token chat completion whose reply must
// name t's version in the X-Clawmesh-Adapter header.
func (d *clawmeshDriver) Warm(ctx context.Context, t Target) error {
	r, _, err := d.chat(ctx, t, d.cfg.BaseModel)
	if err != nil {
		return err
	}
	switch got := r.header.Get(serveapi.AdapterHeader); got {
	case t.Version:
	case "":
		return fmt.Errorf("%w: version %s: the reply names no version in %s: is the upstream `clawmesh serve`?", ErrWarm, t.Version, serveapi.AdapterHeader)
	default:
		return fmt.Errorf("%w: version %s: answered by version %q", ErrWarm, t.Version, got)
	}
	d.log.Debug("warm", "target", t)
	return nil
}

// Unload implements Driver: a no-op, as the server retires a version
// itself once its last request ends.
func (d *clawmeshDriver) Unload(context.Context, Target) error { return nil }
