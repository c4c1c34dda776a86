// Package serveapi is the contract of clawmesh's model server (package
// model/serve, `clawmesh serve`) with the clients that drive it: the
// response header that names the adapter version that served a request,
// the endpoint that loads a version, and that endpoint's JSON bodies. The
// server implements it; the node's gateway and its swap driver speak it.
// It is the one package of model a device's node imports, so it holds
// names and types only: no engine, no I/O.
//
// The adapter endpoint:
//
//	POST {root}/clawmesh/v1/adapter  AdapterRequest
//	  200 AdapterReply (Version and Previous); 400 {"error": {"message"}}
//	  when the adapter does not load; 503 while the server shuts down.
//	GET  {root}/clawmesh/v1/adapter
//	  200 AdapterReply (Version only)
//
// Every reply of the server, completions included, carries AdapterHeader.
package serveapi

// AdapterHeader is the response header in which the model server names the
// adapter version that served a request; the gateway records it as the
// step's adapter, and the swap driver checks it after a load and a warm-up.
const AdapterHeader = "X-Clawmesh-Adapter"

// AdapterPath is the path, below the server's root, of the endpoint that
// reports (GET) and loads (POST) the adapter version the server holds.
const AdapterPath = "/clawmesh/v1/adapter"

// BaseVersion is the version the server reports while it serves the base
// model, before any adapter was loaded.
const BaseVersion = "base"

// AdapterRequest is the body of POST AdapterPath: load the PEFT adapter
// directory Path and serve it as Version.
type AdapterRequest struct {
	Path    string `json:"path"`
	Version string `json:"version"`
}

// AdapterReply is the body of a 200 answer from AdapterPath: the version the
// server now holds and, after a POST, the one it held before.
type AdapterReply struct {
	Version  string `json:"version"`
	Previous string `json:"previous,omitempty"`
}
