// Command none is the baseline of the binary-size comparison.
package main

import "os"

func main() { os.Exit(len(os.Args) - 1) }
