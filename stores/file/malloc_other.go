//go:build !cgo || !linux

package file

// limitMallocArenas: nothing to bound without cgo (Pebble allocates from
// the Go heap) or off Linux (see malloc_cgo.go).
func limitMallocArenas() {}
