// Package personal keeps a device's personal adapter: one trained on the
// device's own steps only, stacked on the mesh's shared version, so that
// the device serves base + shared + personal as one adapter.
package personal
