// Package setup wires a device to its node: it works out how to route
// OpenClaw's default provider through the gateway and edits OpenClaw's
// config (JSON5, keeping every byte it does not change), edits the node's
// config.toml (and puts its lines back), writes the launchd agent and the
// systemd user unit that run the node at login, and finds a model pulled
// with Ollama in Ollama's store (its manifest, and the GGUF blob it
// names) so that the node can serve that file itself. Apart from reading
// Ollama's store, it is pure: text and values in, text out; the commands
// (clawmesh setup, clawmesh service) read and write the files and run the
// programs.
package setup
