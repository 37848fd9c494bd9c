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

// TestFileStoreStructuralDamageRefusedBeforeOpen: a branch page whose
// two children are one page (structural damage that a cursor walks
// through without a panic) is refused by the read-only pre-pass (bbolt's
// consistency check), before the read-write open. (Found by review: it
// passed the pre-pass, bbolt's freelist rebuild (NoFreelistSync)
// panicked inside bolt.Open, which never returned its *DB: the file
// descriptor, its lock and the mmap stayed open, and the next open of
// the repaired file in this process said "in use by another process".)
func TestFileStoreStructuralDamageRefusedBeforeOpen(t *testing.T) {
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
		t.Fatal("opened a damaged file")
	}
	if !strings.Contains(err.Error(), "is damaged") || !strings.Contains(err.Error(), path) {
		t.Fatalf("first open: %v, want an error saying the file is damaged, naming it", err)
	}
	// bbolt's check leaves one goroutine of its own blocked when it
	// finds this damage (its freepages panics without reading its
	// checker's errors): no handle of the file stays open, as the open
	// below shows.
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
