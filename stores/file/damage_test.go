package file

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

// TestFileStoreStructuralDamageKeepsNoLock: a branch page whose two
// children are one page (structural damage that a cursor walks through
// without a panic): the store either refuses the file naming it, or
// opens it (a read of the damaged pages is then an error); either way
// no handle of the file outlives the attempt, so that the file repaired
// in place opens in the same process. (Found by review: with
// NoFreelistSync, bbolt's freelist rebuild panicked inside bolt.Open,
// which never returned its handle: the repaired file was refused as "in
// use by another process" until Caddy restarted. The freelist is synced
// again.)
func TestFileStoreStructuralDamageKeepsNoLock(t *testing.T) {
	content := testDatabase(t)
	const pageSize = 4096
	b := append([]byte(nil), content...)
	damaged := false
	for off := 2 * pageSize; off+pageSize <= len(b); off += pageSize {
		if binary.LittleEndian.Uint16(b[off+8:]) == 0x01 && binary.LittleEndian.Uint16(b[off+10:]) >= 2 {
			// element 1's child := element 0's child
			copy(b[off+16+16+8:off+16+16+16], b[off+16+8:off+16+16])
			damaged = true
		}
	}
	if !damaged {
		t.Fatal("no branch page")
	}
	path := filepath.Join(t.TempDir(), "dedup.db")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := openFileState(path, time.Now, time.Hour, zap.NewNop())
	if err == nil {
		st.Destruct()
	} else if !strings.Contains(err.Error(), "is damaged") || !strings.Contains(err.Error(), path) {
		t.Fatalf("first open: %v, want it opened or refused as damaged, naming the file", err)
	}
	// The operator restores the good content in place (same inode).
	if err := os.WriteFile(path, content, 0o600); err != nil {
		t.Fatal(err)
	}
	st, err = openFileState(path, time.Now, time.Hour, zap.NewNop())
	if err != nil {
		if strings.Contains(err.Error(), "in use") {
			t.Fatalf("repaired file refused: the failed open kept its lock: %v", err)
		}
		t.Fatal(err)
	}
	st.Destruct()
}
