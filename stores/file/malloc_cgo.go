//go:build cgo && linux

package file

// #include <malloc.h>
// static void limitMallocArenas(int n) {
// #ifdef M_ARENA_MAX
// 	mallopt(M_ARENA_MAX, n);
// #endif
// }
import "C"

import (
	"os"
	"sync"
)

// fileMallocArenas bounds glibc's malloc arenas, once per process, before
// the first store opens (unless MALLOC_ARENA_MAX is set: the operator's
// choice stands).
//
// Built with cgo, Pebble allocates its block cache and memtables with C
// malloc, from whichever thread reads or writes. glibc gives threads
// their own arenas (up to 8 per core) and keeps what is freed in each
// for reuse instead of returning it to the OS, so a cache that churns
// (a lookup that misses allocates a block, evicting frees another)
// leaves free memory in every arena it went through. At 26 M records,
// with a 32 MiB cache and 8 MiB memtables, where the cache, the
// memtables and the Go heap held 45 MiB, the process ended at 124 and
// 126 MiB RSS (108 MiB of it anonymous) with glibc's default, 90 MiB
// with two arenas, 80 MiB with one: runs alternated on one store in one
// session (cmd/sangho-bench -filescale measure; docs/stores.md). Two
// arenas, not one: the store's C allocations are one per block read
// from disk and one per memtable, too few to contend on a lock, and a
// second arena spares Caddy's other C allocations, if any, from waiting
// on them. The bound is process-wide (an arena limit cannot be set for
// one library), and set before the store's first allocation.
// Without cgo (Caddy's release builds), Pebble allocates from the Go
// heap, and the Go runtime returns what is freed.
const fileMallocArenas = 2

var limitArenasOnce sync.Once

func limitMallocArenas() {
	limitArenasOnce.Do(func() {
		if _, set := os.LookupEnv("MALLOC_ARENA_MAX"); !set {
			C.limitMallocArenas(fileMallocArenas)
		}
	})
}
