// Command cpuhog keeps every core busy until it is killed or its -for
// duration ends: `make stress` runs the fault and cluster tests beside it, as
// a loaded machine would run them.
package main

import (
	"flag"
	"runtime"
	"time"
)

func main() {
	d := flag.Duration("for", time.Hour, "stop after this long")
	flag.Parse()
	for range runtime.NumCPU() {
		go func() {
			for x := uint64(1); ; x = x*6364136223846793005 + 1 {
				_ = x
			}
		}()
	}
	time.Sleep(*d)
}
