package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	filestore "github.com/sangho/caddy-sangho-dedup/stores/file"
)

// measureFsync times write+fsync of one 4 KiB page, 500 times, in dir:
// the floor of a durable commit on this disk.
func measureFsync(dir string) string {
	f, err := os.CreateTemp(dir, "fsync")
	if err != nil {
		return fmt.Sprintf("\n## Disk\n\nfsync not measured: %v\n", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	page := make([]byte, 4096)
	var d []float64
	for i := range 500 {
		start := time.Now()
		_, _ = f.WriteAt(page, int64(i%64)*4096)
		_ = f.Sync()
		d = append(d, float64(time.Since(start).Microseconds()))
	}
	slices.Sort(d)
	return fmt.Sprintf("\n## Disk\n\nwrite + fsync of a 4 KiB page in the file store's folder, 500 times: p50 %.0f µs, p99 %.0f µs, max %.0f µs. A file store commit makes one (its write-ahead log): about %.0f durable batches per second at the median, each carrying every write that waited for it (group commit).\n",
		d[len(d)/2], d[len(d)*99/100], d[len(d)-1], 1e6/d[len(d)/2])
}

// fileGrowth writes n events through the file store (claim + commit,
// 32 writers paced to fileGrowthRate events/s, retention 3 s, the
// store's own sweeper every 10 s) and samples the file's size against
// the live entries, to show that the store stops growing once events
// expire as fast as they arrive.
func fileGrowth(path string, n int) (string, error) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	st := &filestore.Store{Path: path}
	if err := st.Provision(ctx); err != nil {
		return "", err
	}
	defer st.Cleanup()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	var b strings.Builder
	fmt.Fprintf(&b, "\n## File store size\n\n%d events (claim + commit, 32 writers paced to %d events/s, retention 3 s, the store's sweeper every 10 s):\n\n| events written | seconds | store size MiB | live entries |\n|---|---|---|---|\n", n, fileGrowthRate)
	start := time.Now()
	sample := func() {
		size, _ := dirSize(filestore.StoreDir(path))
		live := countLive(st)
		fmt.Fprintf(&b, "| %d | %.0f | %.1f | %s |\n", next.Load(), time.Since(start).Seconds(), float64(size)/(1<<20), live)
	}
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				sample()
			}
		}
	}()
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				// pace: event i is due at start + i/rate
				if due := start.Add(time.Duration(i) * time.Second / fileGrowthRate); time.Until(due) > 0 {
					time.Sleep(time.Until(due))
				}
				key := fmt.Sprintf("sangho_dedup:evt_growth_%09d", i)
				tok := fmt.Sprintf("tok%d", i)
				if _, _, err := st.Claim(context.Background(), key, tok, 30*time.Second); err != nil {
					failed.Store(err)
					return
				}
				rec := dedup.DoneRecord{ProcessedAt: time.Now(), EventType: "payment_intent.succeeded"}
				if _, err := st.Commit(context.Background(), key, tok, rec, 3*time.Second); err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	next.Store(int64(n))
	time.Sleep(15 * time.Second) // let the sweeper catch up with the last ones
	close(done)
	sample()
	if err, _ := failed.Load().(error); err != nil {
		return "", err
	}
	return b.String(), nil
}

// fileGrowthRate paces the size measurement: a steady rate, so that
// the live set (rate × (retention + sweep interval)) reaches its plateau.
const fileGrowthRate = 5000

// countLive is the number of entries in the file, expired or not: what
// the sweeper has left.
func countLive(st *filestore.Store) string {
	n, err := st.Entries()
	if err != nil {
		return err.Error()
	}
	return fmt.Sprint(n)
}
