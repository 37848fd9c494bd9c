// Command bbolt opens a bbolt database: its binary's size, less none's.
package main

import (
	"os"

	bolt "go.etcd.io/bbolt"
)

func main() {
	db, err := bolt.Open(os.Args[1], 0o600, nil)
	if err == nil {
		_ = db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucketIfNotExists([]byte("x")); return err })
		db.Close()
	}
}
