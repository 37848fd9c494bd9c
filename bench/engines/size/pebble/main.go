// Command pebble opens a Pebble database: its binary's size, less none's.
package main

import (
	"os"

	"github.com/cockroachdb/pebble/v2"
)

func main() {
	db, err := pebble.Open(os.Args[1], &pebble.Options{})
	if err == nil {
		_ = db.Set([]byte("k"), []byte("v"), pebble.Sync)
		db.Close()
	}
}
