//go:build ignore

// fsynccost measures what one durable append costs on this machine: the
// wall time and the process CPU (user + system) of a 1.5 KB append
// followed by fdatasync, the least a durable store does per group
// commit. Run it in the folder of the store's file:
//
//	go run bench/floor/fsynccost.go [file]
package main

import (
	"fmt"
	"os"
	"syscall"
	"time"
)

func cpu() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func main() {
	path := "fsynccost.dat"
	if len(os.Args) > 1 {
		path = os.Args[1]
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer os.Remove(path)
	defer f.Close()
	buf := make([]byte, 1500)
	const n = 2000
	c0, t0 := cpu(), time.Now()
	for range n {
		if _, err := f.Write(buf); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	fmt.Printf("append 1.5 KB + fdatasync, %d times: wall %v each, process CPU %v each\n", n, time.Since(t0)/n, (cpu()-c0)/n)
}
