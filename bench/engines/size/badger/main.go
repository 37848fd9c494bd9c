// Command badger opens a Badger database: its binary's size, less none's.
package main

import (
	"os"

	badger "github.com/dgraph-io/badger/v4"
)

func main() {
	db, err := badger.Open(badger.DefaultOptions(os.Args[1]).WithSyncWrites(true))
	if err == nil {
		_ = db.Update(func(tx *badger.Txn) error { return tx.Set([]byte("k"), []byte("v")) })
		db.Close()
	}
}
