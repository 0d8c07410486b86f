// The chain main > level_one > level_two > level_three > burn_leaf in Go,
// for the unwinding tests. go:noinline keeps every level a real frame;
// each level works after its call so none becomes a tail call.
package main

import (
	"os"
	"strconv"
)

var sink uint64

//go:noinline
func burn_leaf(rounds uint64) uint64 {
	x := rounds
	for i := uint64(0); i < rounds; i++ {
		x = x*6364136223846793005 + 1442695040888963407
	}
	return x
}

//go:noinline
func level_three(rounds uint64) uint64 {
	r := burn_leaf(rounds)
	sink = r
	return r + 3
}

//go:noinline
func level_two(rounds uint64) uint64 {
	r := level_three(rounds)
	sink = r
	return r + 2
}

//go:noinline
func level_one(rounds uint64) uint64 {
	r := level_two(rounds)
	sink = r
	return r + 1
}

func main() {
	rounds := uint64(100000)
	if len(os.Args) > 1 {
		if n, err := strconv.ParseUint(os.Args[1], 10, 64); err == nil {
			rounds = n
		}
	}
	for {
		sink = level_one(rounds)
	}
}
