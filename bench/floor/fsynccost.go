//go:build ignore

// fsynccost measures what one durable write costs on this machine: the
// wall time and the process CPU (user + system) of a 1.5 KB write
// followed by fdatasync, the least a durable store does per group
// commit; once appended to a growing file, once overwriting a file
// written beforehand (whose size and extents do not change), with the
// p50, p99 and p99.9 of the single syncs. Run it in the folder of the
// store's file:
//
//	go run bench/floor/fsynccost.go [file]
package main

import (
	"fmt"
	"os"
	"slices"
	"syscall"
	"time"
)

func cpu() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

const n = 2000

func run(path string, prealloc bool) error {
	flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if !prealloc {
		flags |= os.O_APPEND
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		return err
	}
	defer os.Remove(path)
	defer f.Close()
	buf := make([]byte, 1500)
	if prealloc {
		if _, err := f.Write(make([]byte, n*len(buf))); err != nil {
			return err
		}
		if err := f.Sync(); err != nil {
			return err
		}
	}
	lat := make([]time.Duration, 0, n)
	c0, t0 := cpu(), time.Now()
	for i := range n {
		t := time.Now()
		if prealloc {
			_, err = f.WriteAt(buf, int64(i*len(buf)))
		} else {
			_, err = f.Write(buf)
		}
		if err != nil {
			return err
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			return err
		}
		lat = append(lat, time.Since(t))
	}
	wall, used := time.Since(t0)/n, (cpu()-c0)/n
	slices.Sort(lat)
	mode := "append to a growing file"
	if prealloc {
		mode = "overwrite a written file"
	}
	fmt.Printf("1.5 KB %s + fdatasync, %d times: wall %v each (p50 %v, p99 %v, p99.9 %v, max %v), process CPU %v each\n",
		mode, n, wall, lat[n/2], lat[n*99/100], lat[n*999/1000], lat[n-1], used)
	return nil
}

func main() {
	path := "fsynccost.dat"
	if len(os.Args) > 1 {
		path = os.Args[1]
	}
	for _, prealloc := range []bool{false, true, false, true} {
		if err := run(path, prealloc); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
