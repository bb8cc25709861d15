// Command kubectl-fence is the `kubectl fence` plugin: put it on PATH and run
// `kubectl fence acquire|run|status|release`.
package main

import (
	"os"

	"github.com/fencekeeper/fencekeeper/pkg/fencecli"
)

func main() {
	os.Exit(fencecli.Main(os.Args[1:], fencecli.Streams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}))
}
